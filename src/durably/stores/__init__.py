"""Stores: where a run's state lives, and how one process owns a run at a time.

Every backend offers the same two seams. A :class:`Store` creates, opens, reads
and lists runs; opening hands back a :class:`RunHandle`, which owns the run
exclusively until it is closed (or its process dies) and saves its state.

Both have one lifecycle: an async ``close`` and ``async with``. The file stores
also offer ``close_sync`` for callers without an event loop.
"""

from __future__ import annotations

from typing import Protocol, Self, runtime_checkable

from ..state import RunState

__all__ = ["RunHandle", "Store"]


@runtime_checkable
class RunHandle(Protocol):
    """Exclusive ownership of one run, from open to close.

    A handle may also have ``save_without_waiting(state) -> bool``: save at once,
    synchronously, when its store's saves wait for nothing (the file stores with
    ``sync=False``), and say whether it did; the agent's loop tries it before
    awaiting :meth:`save`.
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
