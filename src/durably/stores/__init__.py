"""Stores: where a run's state lives, and how one process owns a run at a time.

Every backend offers the same two seams. A :class:`Store` creates, opens, reads
and lists runs; opening hands back a :class:`RunHandle`, which owns the run
exclusively until it is closed (or its process dies) and saves its state.

Both have one lifecycle: an async ``close`` and ``async with``. The file stores
also offer ``close_sync`` for callers without an event loop.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol, Self, runtime_checkable

from ..state import RunState

__all__ = ["CancelOutcome", "Housekeeping", "PruneReport", "RunHandle", "Store"]


@runtime_checkable
class RunHandle(Protocol):
    """Exclusive ownership of one run, from open to close.

    A handle may also have ``save_without_waiting(state) -> bool``: save at once,
    synchronously, when its store's saves wait for nothing (the file stores with
    ``sync=False``), and say whether it did; the agent's loop tries it before
    awaiting :meth:`save`.

    A handle whose store offers :class:`Housekeeping` also has
    ``cancel_requested() -> bool``: whether ``durably cancel`` asked the owner to
    stop. The engine asks after each save where no call is in flight; it must be
    cheap (one ``lstat``, or a flag the last save's statement returned).
    """

    @property
    def run_id(self) -> str:
        """The run this handle owns."""
        ...

    async def save(self, state: RunState) -> None:
        """Make ``state`` the run's durable state; when this returns, it survives a crash."""
        ...

    async def close(self) -> None:
        """Give up ownership; another process may open the run from now on."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc_info: object) -> None: ...


@runtime_checkable
class Store(Protocol):
    """Creates, opens, reads and lists runs."""

    async def create(self, state: RunState) -> RunHandle:
        """Claim a new run ID, save ``state`` as its first state, and own it.

        Raises ``RunExists`` when the ID was ever used in this store.
        """
        ...

    async def open(self, run_id: str) -> tuple[RunHandle, RunState]:
        """Own an existing run and load its state.

        Raises ``Locked`` at once when another process owns it, ``RunNotFound``
        when there is no such run, ``CheckpointCorrupt`` when its state cannot be read.
        """
        ...

    async def read(self, run_id: str) -> RunState:
        """Load a run's state without owning it (for people and dashboards)."""
        ...

    async def list_runs(self) -> list[str]:
        """The IDs of every run in the store, sorted."""
        ...

    def describe(self, run_id: str) -> str:
        """Where the run lives, for messages (a file path, a table row)."""
        ...

    async def close(self) -> None:
        """Free what the store holds (a directory descriptor, a connection pool).

        Handles opened from the store stay usable until they are closed, and a
        store used again after ``close`` opens what it needs again. Closing twice
        is harmless. ``async with store:`` closes it on the way out.
        """
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc_info: object) -> None: ...


class CancelOutcome(enum.StrEnum):
    """What :meth:`Housekeeping.cancel` did."""

    CANCELLED = "cancelled"
    """Nobody owned the run (paused, parked, queued, or its process died): the store
    saved phase ``cancelled`` itself, and the run will never be claimed or resumed."""
    REQUESTED = "requested"
    """A process owns the run: it was asked to stop and ends the run as ``cancelled``
    after its current save (a call that has its marker finishes its ladder story first)."""
    FINISHED = "finished"
    """The run was already ``done`` or ``cancelled``; nothing changed."""


@dataclass(frozen=True, slots=True)
class PruneReport:
    """What :meth:`Housekeeping.prune` removed and what it left alone."""

    pruned: tuple[str, ...]
    """Finished runs deleted with everything they held (state, logs, lock, keys)."""
    owned: tuple[str, ...] = ()
    """Finished and old enough, but held by a process at the time: left for the next prune."""


@runtime_checkable
class Housekeeping(Protocol):
    """Stopping runs and removing finished ones: what an operator does every day.

    The file, journal and Postgres stores offer it. Both methods are crash-safe: a
    kill at any instant leaves every run whole or gone, never half pruned, and a
    cancel either took effect or did not.
    """

    async def cancel(self, run_id: str) -> CancelOutcome:
        """Stop ``run_id``: at once if nobody owns it, else after its owner's current save.

        Raises ``RunNotFound`` when there is no such run.
        """
        ...

    async def prune(self, *, older_than: timedelta, now: datetime | None = None) -> PruneReport:
        """Delete every finished run (``done``, ``cancelled``) saved before ``now - older_than``.

        Never touches a run that is not finished, nor one a process holds. ``now``
        defaults to the current time (UTC); tests pass their own.
        """
        ...
