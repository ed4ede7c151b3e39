"""The reference triage agent: a model, the triage tools, and one run's world.

:func:`build_agent` assembles a :class:`durably.Agent` for a task over a world.
The model is the task's recording (:func:`recording_path`) unless another is
given; every model call is logged to the world's ``model_calls.jsonl`` so the
checks can tell a reply paid twice.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from importlib import resources
from pathlib import Path

from ..approval import Approver
from ..loop import Agent, Event, Limits
from ..models import Model
from ..models.replay import ReplayModel
from ..state import utcnow
from ..stores import Store
from ..workspace import Workspace
from .tools import ToolOptions, make_tools
from .world import World

__all__ = ["SYSTEM", "build_agent", "recording_path", "replay_model"]

SYSTEM = """You are the on-call engineer for the `todo` library. You get a batch of crash \
reports from production. Work like a careful senior engineer:

1. Read the reports and the code they point at; group the reports by root cause.
2. Search the tracker first; file exactly one issue per root cause, with a body that names \
every report it explains. Never file a cause twice: if the tracker says it is already \
filed, use the existing issue.
3. For each cause, write a regression test under tests/ that fails on the current code.
4. Patch the code with the smallest change that fixes the cause; run the tests until they pass.
5. Comment on each issue with the fix, then answer with a short summary.

Filing an issue needs a person's approval; if they refuse, do not file it."""


def recording_path(task: str) -> Path:
    """The bundled recording of ``task``."""
    return Path(str(resources.files("durably.triage") / "recordings" / f"{task}.json"))


def replay_model(world: World, *, fickle: bool = False) -> ReplayModel:
    """The recorded model for a world's task, logging its calls into the world."""
    return ReplayModel(recording_path(world.task), log=world.model_log, fickle=fickle)


def build_agent(  # noqa: PLR0913 - the demo agent's options, keyword-only with defaults
    *,
    world: World,
    store: Store | None,
    approver: Approver,
    model: Model | None = None,
    options: ToolOptions | None = None,
    limits: Limits | None = None,
    observer: Callable[[Event], None] | None = None,
    clock: Callable[[], datetime] = utcnow,
    sync: bool = True,
) -> Agent:
    """The triage agent for one world.

    Args:
        world: the run's world (workspace, tracker).
        store: where the run's checkpoints live; None for an agent that is given its
            run's handle (a Postgres worker's).
        approver: answers approvals and in-doubt questions.
        model: the model (default: the task's recording).
        options: how the world's services behave (keys honoured, lookups).
        limits: limits over the run's life.
        observer: receives the loop's events (live output).
        clock: time source for the loop and the tracker.
        sync: fsync workspace writes and the tracker's commits (off only in sweeps that
            kill processes, not the power).
    """
    options = options or ToolOptions()
    task = world.load_task()
    tracker = world.tracker(
        honour_keys=options.honour_keys,
        key_ttl=options.key_ttl,
        clock=clock,
        sync=sync,
        refile_guard=options.refile_guard,
    )
    return Agent(
        model=model or replay_model(world),
        tools=make_tools(world, task, tracker, options),
        store=store,
        limits=limits or Limits(max_turns=40, max_dollars=5.0),
        approver=approver,
        system=SYSTEM,
        workspace=Workspace(world.workspace, sync=sync),
        clock=clock,
        observer=observer,
    )
