"""The triage agent for Postgres workers: registered through the ``durably.agents`` entry point.

``durably worker`` loads every installed hook of that group (``pyproject.toml``
names :func:`register_agents`), so the demo's agents are served without an
``--import``, while the library itself never imports the demo.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..approval import PolicyApprover
from .agent import build_agent
from .world import TASKS, World, load_task

if TYPE_CHECKING:
    from ..loop import Agent
    from ..postgres.registry import Registry

__all__ = ["register_agents"]


def register_agents(registry: Registry, *, state_dir: Path) -> None:
    """Register the reference triage agent as ``triage:<task>`` for every bundled task.

    Each run's world lives under ``<state_dir>/worlds/<run_id>`` (shared by every
    worker that may resume the run); calls needing approval are approved (a worker
    has no terminal) and in-doubt calls the ladder cannot settle pause the run for
    a person.

    Args:
        registry: where to register the agents.
        state_dir: the worker's ``--state`` directory.
    """
    for task_name in TASKS:

        def factory(run_id: str, task_name: str = task_name) -> Agent:
            world = World.ensure(state_dir / "worlds" / run_id, task_name)
            return build_agent(world=world, store=None, approver=PolicyApprover())

        registry.register(f"triage:{task_name}", factory, task=load_task(task_name).description)
