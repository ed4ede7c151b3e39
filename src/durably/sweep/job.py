"""The job protocol: what every sweep needs from the job it kills, and the approver it runs with."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..approval import ApprovalRequest, Approver, Done, Rerun, ResolveRequest, Yes
from ..models import CallLog
from ..state import RunState
from .world import World

__all__ = ["CommandJob", "DemoOutcome", "SweepAgent", "SweepApprover", "SweepJob"]


class SweepAgent(Protocol):
    """What the sweep runs: ``durably.Agent``, or a front end's agent with its two calls.

    A Pydantic AI agent with ``Durable`` is wrapped so ``resume`` calls ``Durable.resume``.
    """

    async def run(self, task: str, *, run_id: str) -> object:
        """Start the run ``run_id`` of ``task`` and drive it until it is done or paused."""
        ...

    async def resume(self, run_id: str) -> object:
        """Carry the run on from its last save."""
        ...


class SweepJob(Protocol):
    """What every sweep needs from a job: a world to build, an agent to run, a way to judge.

    The one job protocol. A job may also list the knobs of its own world that a
    configuration can turn on (``knobs``: name to meaning; see
    :attr:`durably.sweep.Config.knobs`), and be run as a user runs it
    (:class:`CommandJob`, for the random sweep).
    """

    name: str

    def prepare(self, world: World) -> None:
        """Make a fresh world (receivers, workspace) under ``world.root``."""
        ...

    def task(self) -> str:
        """The task the run is started with."""
        ...

    def agent(self, world: World, approver: Approver) -> SweepAgent:
        """The agent for this world, built anew in every process."""
        ...

    def call_log(self, world: World) -> CallLog:
        """The model's call log."""
        ...

    def effects(self, world: World) -> Counter[str]:
        """Every side effect the receivers performed, as a multiset of descriptions."""
        ...

    def oracle(self, world: World, request: ResolveRequest) -> Rerun | Done:
        """What a careful person finds when asked whether an in-doubt call happened."""
        ...

    def checks(self, world: World, state: RunState) -> list[str]:
        """Names (with reasons) of the checks a finished world fails."""
        ...

    def fingerprint(self, world: World) -> str:
        """A digest of everything a crash now would leave behind."""
        ...


@dataclass(frozen=True, kw_only=True)
class DemoOutcome:
    """What a finished run left: its checks' verdicts and the effects its receivers performed."""

    checks: tuple[tuple[str, bool, str], ...]
    """(name, passed, reason if not) for every check of the job's catalog."""
    effects: Counter[str]
    """Every side effect the receivers performed, as a multiset of descriptions."""


class CommandJob(SweepJob, Protocol):
    """A sweep job that can also be run as a user runs it: its command, and how to judge it.

    What the random kill method (:mod:`durably.sweep.randomkill`) needs on top
    of :class:`SweepJob`: each process is the job's command in a fresh
    interpreter, and a finished run is judged by what it left under its state
    directory.
    """

    def command(self, state: Path, store: str) -> list[str]:
        """The command that starts the run kept under ``state`` on ``store``, or resumes it."""
        ...

    def outcome(self, state: Path) -> DemoOutcome | None:
        """What the finished run under ``state`` left, or None if no run there finished."""
        ...


class SweepApprover:
    """Approves every call; answers in-doubt questions from the job's oracle, logging each.

    The approver every process of a sweep runs with; a benchmark or a job's own
    test that runs the job as a scenario's process does uses it too.
    """

    def __init__(self, job: SweepJob, world: World) -> None:
        self.job, self.world = job, world

    async def approve(self, request: ApprovalRequest) -> Yes:
        """Yes, always: the sweep judges durability, not a person's choices."""
        return Yes()

    async def resolve(self, request: ResolveRequest) -> Rerun | Done:
        """The job's oracle's answer; the question is logged in the world first."""
        with self.world.questions_log.open("a") as out:
            out.write(json.dumps({"call_id": request.call_id, "tool": request.tool}) + "\n")
        return self.job.oracle(self.world, request)
