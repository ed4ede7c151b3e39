"""A directory of runs, whichever file store wrote each one (for people's tools).

A user's service keeps its runs with ``FileStore("runs/")`` or
``JournalStore("runs/")``; the commands a person runs over that directory
(``durably pending``, ``answer``, ``resume``, ``console``) must not care which.
Reading goes through the journal store, which reads both layouts. Opening (to
save) must use the store that wrote the run: a snapshot store's save of a
journal run would leave the journal's log behind, and the other way round the
user's ``FileStore`` could no longer read the run. So a run is opened with the
snapshot store first, and with the journal store when the snapshot names a
journal generation (``WrongStore``).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Self

from ..errors import WrongStore
from ..state import RunState
from . import CancelOutcome, PruneReport
from .file import FileRun, FileStore
from .journal import JournalStore

__all__ = ["DirectoryStore"]


class DirectoryStore:
    """Every run in ``directory``, opened with the kind of file store that wrote it.

    Args:
        directory: the directory a ``FileStore`` or ``JournalStore`` was given.
        **options: passed to both stores (``sync``, ``allow_network_fs``).
    """

    def __init__(self, directory: str | os.PathLike[str], **options: Any) -> None:
        self.directory = Path(directory)
        self._snapshot = FileStore(directory, **options)
        self._journal = JournalStore(directory, **options)

    async def create(self, state: RunState) -> FileRun:
        """Start a new run as a snapshot-store run (``FileStore``'s layout)."""
        return await self._snapshot.create(state)

    async def open(self, run_id: str) -> tuple[FileRun, RunState]:
        """Own a run with the store that wrote it (``Locked`` at once if owned elsewhere)."""
        try:
            return await self._snapshot.open(run_id)
        except WrongStore:
            return await self._journal.open(run_id)

    async def read(self, run_id: str) -> RunState:
        """Load a run's state without taking its lock, whichever store wrote it."""
        return await self._journal.read(run_id)

    async def list_runs(self) -> list[str]:
        """The IDs of every run in the directory, sorted."""
        return await self._journal.list_runs()

    def describe(self, run_id: str) -> str:
        """The path of the run's state file."""
        return self._journal.describe(run_id)

    async def cancel(self, run_id: str) -> CancelOutcome:
        """Stop ``run_id`` (see :meth:`FileStore.cancel`), saved by the store that wrote it."""
        try:
            return await self._snapshot.cancel(run_id)
        except WrongStore:
            return await self._journal.cancel(run_id)

    async def prune(self, *, older_than: timedelta, now: datetime | None = None) -> PruneReport:
        """Delete finished runs saved before ``now - older_than`` (see :meth:`FileStore.prune`).

        The journal store reads both layouts, and a prune only reads before it deletes.
        """
        return await self._journal.prune(older_than=older_than, now=now)

    async def close(self) -> None:
        """Close the directory descriptors (see :meth:`FileStore.close`)."""
        self.close_sync()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def close_sync(self) -> None:
        """Blocking form of :meth:`close`, for callers without an event loop."""
        self._snapshot.close_sync()
        self._journal.close_sync()
