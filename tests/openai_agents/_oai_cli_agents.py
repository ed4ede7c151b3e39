"""The OpenAI Agents SDK refunds agent as ``durably resume --agent`` and ``durably worker`` find it.

Its world is under ``$DURABLY_TEST_ROOT`` (the service, the model's log, the file
store ``runs``). Importing the module registers ``oai-refunds`` with Postgres
workers (``durably worker --import _oai_cli_agents``), its runner built with no
store: the worker runs it on the run it claimed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from _oai_world import build
from agents import Agent

import durably
from _helpers.refund_world import TASK, Service
from durably.openai_agents import WorkerAgent, worker_agent
from durably.postgres import register


def _root() -> Path:
    return Path(os.environ["DURABLY_TEST_ROOT"])


def _built(store: durably.FileStore | None) -> WorkerAgent:
    service = Service(_root() / "service")
    service.prepare()
    agent, runner = build(store, service, durably.CallLog(_root() / "model.jsonl"))
    return worker_agent(agent, runner)


def refunds(run_id: str) -> WorkerAgent:
    """The agent on the world's file store, as ``durably resume --agent`` drives it."""
    return _built(durably.FileStore(_root() / "runs", sync=False))


def bare(run_id: str) -> Agent[Any]:
    """The SDK agent itself, not wrapped: what a worker cannot drive."""
    return _built(None).agent


def for_worker(run_id: str) -> WorkerAgent:
    """The agent with a runner that has no store of its own, for a worker."""
    return _built(None)


register("oai-refunds", for_worker, task=TASK)
