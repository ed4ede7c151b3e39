"""Store backends as the conformance suite sees them: a way to make the store, and to
reach under it (plant raw bytes as a run's stored state, read them back).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import psycopg

from durably.postgres import PostgresStore
from durably.stores import Store
from durably.stores.file import FileStore


@dataclass(frozen=True)
class Backend:
    """A store backend under test."""

    name: str
    open: Callable[[], AbstractAsyncContextManager[Store]]
    """A store on the backend's place (a new object each time, the same runs)."""
    plant: Callable[[str, bytes], None]
    """Replace what the store keeps as a run's state with these bytes."""
    raw: Callable[[str], bytes]
    """What the store keeps as a run's state, byte for byte."""


def file_backend(directory: Path, store_class: type[FileStore] = FileStore) -> Backend:
    """A file store (or a subclass with the same layout) in ``directory``."""

    @contextlib.asynccontextmanager
    async def open_store() -> AsyncIterator[Store]:
        store = store_class(directory)
        try:
            yield store
        finally:
            await store.close()

    def plant(run_id: str, data: bytes) -> None:
        (directory / f"{run_id}.json").write_bytes(data)

    def raw(run_id: str) -> bytes:
        return (directory / f"{run_id}.json").read_bytes()

    return Backend(name=store_class.__name__, open=open_store, plant=plant, raw=raw)


def postgres_backend(dsn: str, *, lease: timedelta = timedelta(seconds=30)) -> Backend:
    """A Postgres store on ``dsn``."""

    @contextlib.asynccontextmanager
    async def open_store() -> AsyncIterator[Store]:
        async with PostgresStore(dsn, lease=lease) as store:
            yield store

    def plant(run_id: str, data: bytes) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            # The bytes become the whole truth: a snapshot with no changes after it.
            done = conn.execute(
                "UPDATE durably_runs SET state = %s, state_seq = 0, seq = 0 WHERE run_id = %s",
                (data, run_id),
            )
            assert done.rowcount == 1
            conn.execute("DELETE FROM durably_changes WHERE run_id = %s", (run_id,))

    def raw(run_id: str) -> bytes:
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                "SELECT state FROM durably_runs WHERE run_id = %s", (run_id,)
            ).fetchone()
            assert row is not None
            return bytes(row[0])

    return Backend(name="PostgresStore", open=open_store, plant=plant, raw=raw)
