"""Which store a person's command or the console works on, and opening it.

A store is named by a directory (a ``FileStore``/``JournalStore``'s, read through
:class:`~durably.stores.directory.DirectoryStore`) or by a Postgres connection
string. It sits below both the command line (:mod:`durably.cli.person`, which
builds a choice from its arguments) and the console (:mod:`durably.console`,
which is handed one), so neither imports the other for it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .stores import Store

__all__ = ["StoreChoice", "opened_store"]


class StoreChoice:
    """Which store a command works on, as the command line named it.

    Args:
        directory: a file store's directory.
        dsn: a Postgres connection string (used when ``directory`` is None).
    """

    def __init__(self, *, directory: Path | None = None, dsn: str | None = None) -> None:
        self.directory = directory
        self.dsn = dsn

    def describe(self) -> str:
        """Where the store is, for messages and page titles."""
        if self.directory is not None:
            return str(self.directory)
        from .postgres.store import PostgresStore

        return PostgresStore(self.dsn or "").describe("").split(" ", 1)[0]


@asynccontextmanager
async def opened_store(choice: StoreChoice) -> AsyncIterator[Store]:
    """The store ``choice`` names, closed on the way out."""
    store: Store
    if choice.directory is not None:
        from .stores.directory import DirectoryStore

        store = DirectoryStore(choice.directory)
    else:
        from .postgres.store import PostgresStore

        store = PostgresStore(choice.dsn or "")
    async with store:
        yield store
