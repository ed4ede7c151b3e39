"""The Pydantic AI refunds agent as ``durably resume --agent`` and ``durably worker`` find it.

Its world is under ``$DURABLY_TEST_ROOT`` (the service, the model's log, the file
store ``runs``). Importing the module registers ``pai-refunds`` with Postgres
workers (``durably worker --import _pai_cli_agents``), built with no store: the
worker runs it on the run it claimed.
"""

from __future__ import annotations

import os
from pathlib import Path

from _pai_world import build

import durably
from _helpers.refund_world import TASK, Service
from durably.postgres import register
from durably.pydantic_ai import WorkerAgent, worker_agent
from pydantic_ai import Agent


def _root() -> Path:
    return Path(os.environ["DURABLY_TEST_ROOT"])


def _agent(store: durably.FileStore | None) -> Agent[None, str]:
    service = Service(_root() / "service")
    service.prepare()
    agent, _ = build(store, service, durably.CallLog(_root() / "model.jsonl"), streaming=True)
    return agent


def refunds(run_id: str) -> WorkerAgent:
    """The agent on the world's file store, as ``durably resume --agent`` drives it."""
    return worker_agent(_agent(durably.FileStore(_root() / "runs", sync=False)))


def bare(run_id: str) -> Agent[None, str]:
    """The Pydantic AI agent itself, not wrapped: what a worker cannot drive."""
    return _agent(durably.FileStore(_root() / "runs", sync=False))


def for_worker(run_id: str) -> WorkerAgent:
    """The agent with no store of its own, for a worker."""
    return worker_agent(_agent(None))


register("pai-refunds", for_worker, task=TASK)
