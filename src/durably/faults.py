"""Crash points: labelled places where a test can kill the process.

Library code calls :func:`point` at every place a crash matters (inside a save,
after a reply arrives, after a tool returns). With no plan installed it is one
context-variable read and costs nothing worth measuring. A :class:`CrashPlan`
records every label reached, in order, and can kill the process with SIGKILL at
the Nth point or at the first point with a given label. SIGKILL, not an
exception: no ``finally`` runs, no lock is released politely, no buffer flushed.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["CrashPlan", "active_plan", "installed", "point"]


def _sigkill() -> None:
    import signal  # here: a store imports this module, and only a test arms a fault

    os.kill(os.getpid(), signal.SIGKILL)


@dataclass(kw_only=True)
class CrashPlan:
    """Where to crash, and a record of every crash point reached.

    Points are counted from 1 in the order they are reached. ``at`` kills at that
    count; ``label`` kills at the ``occurrence``-th point carrying that label (a
    label ending in ``*`` matches by prefix). ``kill`` is what crashing means;
    the default is SIGKILL to this process.
    """

    at: int | None = None
    label: str | None = None
    occurrence: int = 1
    kill: Callable[[], None] = _sigkill
    reached: list[str] = field(default_factory=list)
    on_point: Callable[[str], None] | None = None
    """Called at every point before the kill decision (the power-loss model hooks in here)."""
    _matches: int = 0

    def hit(self, label: str) -> None:
        """Record that a point was reached, and crash if it is the planned one."""
        self.reached.append(label)
        if self.on_point is not None:
            self.on_point(label)
        if self.at is not None and len(self.reached) == self.at:
            self.kill()
        if self.label is not None and _matches(self.label, label):
            self._matches += 1
            if self._matches == self.occurrence:
                self.kill()


def _matches(pattern: str, label: str) -> bool:
    if pattern.endswith("*"):
        return label.startswith(pattern[:-1])
    return label == pattern


_plan: contextvars.ContextVar[CrashPlan | None] = contextvars.ContextVar(
    "durably_crash_plan", default=None
)


def point(label: str) -> None:
    """Mark a crash point. Free when no plan is installed."""
    plan = _plan.get()
    if plan is not None:
        plan.hit(label)


def active_plan() -> CrashPlan | None:
    """The plan installed in this context, if any."""
    return _plan.get()


@contextmanager
def installed(plan: CrashPlan) -> Iterator[CrashPlan]:
    """Install a plan for the code run inside the block (and threads it starts with to_thread)."""
    token = _plan.set(plan)
    try:
        yield plan
    finally:
        _plan.reset(token)
