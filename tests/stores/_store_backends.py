"""Store backends as the conformance suite sees them: a way to make the store, and to
reach under it (plant raw bytes as a run's stored state, read them back).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import psycopg

from durably.postgres import PostgresStore
from durably.stores import Store
from durably.stores.file import FileStore
from durably.testing.stores import StoreUnderTest


@dataclass(frozen=True)
class Backend:
    """A store backend under test."""

    name: str
    make: Callable[[], Store]
    """A store on the backend's place (a new object each time, the same runs)."""
    plant: Callable[[str, bytes], None]
    """Replace what the store keeps as a run's state with these bytes."""
    raw: Callable[[str], bytes]
    """What the store keeps as a run's state, byte for byte."""

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[Store]:
        """A new store object, closed on the way out."""
        async with self.make() as store:
            yield store

    def subject(self) -> StoreUnderTest:
        """The backend as ``durably.testing.stores`` takes a store."""
        return StoreUnderTest(name=self.name, make=self.make, plant=self.plant, raw=self.raw)


def file_backend(directory: Path, store_class: Callable[[Path], Store] = FileStore) -> Backend:
    """A store with the file stores' layout (one ``<run>.json`` per run) in ``directory``."""

    def plant(run_id: str, data: bytes) -> None:
        (directory / f"{run_id}.json").write_bytes(data)

    def raw(run_id: str) -> bytes:
        return (directory / f"{run_id}.json").read_bytes()

    name = getattr(store_class, "__name__", "file store")
    return Backend(name=name, make=lambda: store_class(directory), plant=plant, raw=raw)


def postgres_backend(dsn: str, *, lease: timedelta = timedelta(seconds=30)) -> Backend:
    """A Postgres store on ``dsn``."""

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

    return Backend(
        name="PostgresStore", make=lambda: PostgresStore(dsn, lease=lease), plant=plant, raw=raw
    )
