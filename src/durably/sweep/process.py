"""A scenario's processes: forked children that die by a real SIGKILL, and the recorder.

Every process of a scenario is a child forked from a warm worker: it starts or
resumes the run under a crash plan, and exits 0, or 1 after printing what it
raised, or dies by a signal. The recorder notes the crash points a process
reaches and a fingerprint of the disk at each.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from .. import faults
from . import _output
from .job import SweepApprover, SweepJob
from .world import RUN_ID, World

__all__ = [
    "LABELS",
    "WINDOW_END",
    "Kill",
    "LabelKill",
    "run_in_child",
    "run_process",
    "run_scenario_process",
    "was_killed",
]

WINDOW_END = "loop.saved.reply"
"""The label that closes a restart's recovery window (its first saved model reply)."""


def run_in_child(body: Callable[[], None]) -> int:
    """Run ``body`` in a forked child; return its wait status (SIGKILL shows as signalled).

    How every process of a scenario runs: a child of this (warm) process that
    exits with 0, or 1 after printing what ``body`` raised, or dies by a signal.
    """
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        code = 0
        # The run's warnings (a reply lost before its save) are what the sweep
        # provokes on purpose: printed by Python's last-resort handler in each of
        # thousands of children, they would bury the report. They go to the
        # capture file the caller counts, or nowhere (:mod:`._output`); a handler
        # the user configured still receives them (they propagate).
        _output.scenario_logging()
        try:
            body()
        except BaseException:  # noqa: BLE001 - a child scenario: any end is its exit status
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


def run_scenario_process(
    job: SweepJob,
    world: World,
    *,
    first: bool,
    plan: faults.CrashPlan,
    record: Path | None,
    window_only: bool = False,
) -> int:
    """One process of the run: start it or resume it, under a crash plan.

    With ``record``, the labels of every point reached and fingerprints of the
    disk at each are written there; ``window_only`` stops fingerprinting once
    the recovery window (see :func:`~durably.sweep.judge.recovery_window`) has
    closed and the disk changed.
    """
    # A crash before the start save returned leaves no run: the next process starts it.
    # Asked here, in the warm parent, where it costs no copied pages: nothing runs
    # between this look and the child's start.
    start = first or not world.has_run()

    def body() -> None:
        recorder = Recorder(job, world, window_only=window_only)
        if record is not None:
            plan.on_point = recorder.observe
        run_process(job, world, start=start, plan=plan)
        if record is not None:
            record.write_text(json.dumps(recorder.record(plan)))

    return run_in_child(body)


class Recorder:
    """What a restart sees at its crash points: their fingerprints, and which are new.

    A fingerprint is taken at every point until the recovery window (see
    :func:`~durably.sweep.judge.recovery_window`) has closed and the disk has changed after it (with
    ``window_only``; else at every point): the equal points after the window's
    last still count towards its cover.
    """

    def __init__(self, job: SweepJob, world: World, *, window_only: bool, merge: bool = True):
        self._job, self._world, self._window_only, self._merge = job, world, window_only, merge
        self.prints: list[str] = []
        # "open", then "closing" after the window's last point (its equal points
        # after it still count), then "closed" once the disk changes.
        self._window = "open"

    def at_point(self, label: str) -> bool:
        """Fingerprint this point; whether it is a second-crash candidate.

        A candidate is a point inside the recovery window whose fingerprint
        differs from the point before it (every point inside, without
        ``merge``): the points :func:`judge_scenario` chooses from the record.
        """
        if self._window == "closed":
            return False
        digest = self._job.fingerprint(self._world)
        if self._window == "closing":
            if digest != self.prints[-1]:
                self._window = "closed"
                return False
            self.prints.append(digest)
            return False
        new = not self._merge or not self.prints or digest != self.prints[-1]
        self.prints.append(digest)
        if self._window_only and label == WINDOW_END:
            self._window = "closing"
        return new

    def observe(self, label: str) -> None:
        """:meth:`at_point`, as a crash plan's ``on_point``."""
        self.at_point(label)

    def record(self, plan: faults.CrashPlan) -> dict[str, Any]:
        """The labels of every point reached and the fingerprints taken, for the harness."""
        return {"labels": plan.reached, "prints": self.prints}


def run_process(
    job: SweepJob,
    world: World,
    *,
    start: bool,
    plan: faults.CrashPlan,
    prepare: Callable[[], None] | None = None,
) -> None:
    """The body of every process of a run: start or resume it under ``plan``.

    ``prepare`` runs first inside the process's event loop. The run's final
    state is not the coroutine's result, which ``asyncio.run`` formats (a
    repr of the whole state) when it restores the SIGINT handler.
    """
    agent = job.agent(world, SweepApprover(job, world))

    async def main() -> None:
        if prepare is not None:
            prepare()
        if start:
            await agent.run(job.task(), run_id=RUN_ID)
        else:
            await agent.resume(RUN_ID)

    with faults.installed(plan):
        asyncio.run(main())


def was_killed(status: int) -> bool:
    """Whether a child's wait status says SIGKILL ended it."""
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


class Kill(Protocol):
    """A kill method: how one process of a scenario runs, and how it is killed where planned.

    Each sweep enumerates its own kill points and numbers them its own way
    (a labelled point's index, a system call's ``when=`` count); the engine
    (:func:`durably.sweep.engine.restart_and_judge`) asks the kill method for a
    process dying at one of them, or for an unkilled one (``at`` None).
    """

    exact: bool
    """A planned kill always lands (the kill method counts exactly what it kills at):
    a planned kill that did not happen, or a run still unfinished after every
    restart, is then the harness's error, not a finding."""

    def process(
        self, job: SweepJob, world: World, *, first: bool, at: int | None, record: Path | None
    ) -> int:
        """Start (``first``) or resume the run in a child, dying at ``at``; its wait status.

        With ``record``, the process's crash points and fingerprints are written there.
        """
        ...


class LabelKill:
    """The labelled kill method: the process SIGKILLs itself at its ``at``-th crash point.

    A restart that records (``record``) fingerprints only its recovery window
    (see :func:`run_scenario_process`).
    """

    exact = False

    def process(
        self, job: SweepJob, world: World, *, first: bool, at: int | None, record: Path | None
    ) -> int:
        """:func:`run_scenario_process` under ``faults.CrashPlan(at=at)``."""
        plan = faults.CrashPlan(at=at) if at is not None else faults.CrashPlan()
        return run_scenario_process(
            job, world, first=first, plan=plan, record=record, window_only=True
        )


LABELS = LabelKill()
"""The labelled kill method; also how every unkilled restart runs."""
