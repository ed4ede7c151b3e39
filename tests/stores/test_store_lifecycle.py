"""One store lifecycle for every backend: an async ``close``, ``async with``, and handles that
outlive the store object they came from.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from _helpers.samples import state_a, state_b, without_saved_at
from durably import FileStore, JournalStore
from durably.postgres import PostgresStore
from durably.stores import Store
from durably.stores.directory import DirectoryStore


@dataclass(frozen=True)
class Kind:
    """How to make one backend's store, and how to count what an open store holds."""

    make: Callable[[], Store]
    held: Callable[[], int]
    """What the store holds from the system: open descriptors, or server connections."""


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def _kind(name: str, request: pytest.FixtureRequest) -> Kind:
    tmp_path: Path = request.getfixturevalue("tmp_path")
    if name == "postgres":
        tag = f"lifecycle_{secrets.token_hex(4)}"
        dsn = f"{request.getfixturevalue('pg_dsn')} application_name={tag}"

        def connections() -> int:
            with psycopg.connect(dsn, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE application_name = %s AND pid <> pg_backend_pid()",
                    (tag,),
                ).fetchone()
                assert row is not None
                return int(row[0])

        return Kind(make=lambda: PostgresStore(dsn), held=connections)
    made: dict[str, Callable[[], Store]] = {
        "file": lambda: FileStore(tmp_path / "runs", sync=False),
        "journal": lambda: JournalStore(tmp_path / "runs", sync=False),
        "directory": lambda: DirectoryStore(tmp_path / "runs", sync=False),
    }
    return Kind(make=made[name], held=_open_descriptors)


@pytest.fixture(
    params=["file", "journal", "directory", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def kind(request: pytest.FixtureRequest) -> Kind:
    """One store backend, with a count of what its open store holds."""
    return _kind(request.param, request)


def test_close_is_a_coroutine_on_every_store(kind: Kind) -> None:
    """Every store closes with ``await store.close()``, as the ``Store`` protocol says."""
    store = kind.make()
    assert isinstance(store, Store)
    assert inspect.iscoroutinefunction(store.close)


def settled(count: Callable[[], int], expected: int, *, within: float = 30.0) -> int:
    """``count()`` once it equals ``expected``, or its last value after ``within`` seconds.

    A server ends a backend a moment after its client hung up: until then
    ``pg_stat_activity`` still lists it, so a count taken at once can be one too many.
    """
    deadline = time.monotonic() + within
    while (value := count()) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def test_leaving_async_with_frees_what_the_store_held(kind: Kind) -> None:
    """``async with`` gives the store itself, and leaving it frees its descriptors or its
    connections; a second close is harmless.
    """

    async def scenario() -> tuple[int, int, int]:
        before = kind.held()
        async with kind.make() as store:
            await (await store.create(state_a("r1"))).close()
            assert await store.list_runs() == ["r1"]
            during = kind.held()
        after = settled(kind.held, before)
        await store.close()
        return before, during, after

    before, during, after = asyncio.run(scenario())
    assert during > before
    assert after == before


def test_a_handle_outlives_the_closed_store_and_the_store_opens_again(kind: Kind) -> None:
    """A handle opened before its store was closed still saves and closes, and a closed store
    used again opens what it needs again.
    """

    async def scenario() -> None:
        store = kind.make()
        handle = await store.create(state_a("r1"))
        await store.close()
        await handle.save(state_b("r1"))
        await handle.close()
        assert without_saved_at(await store.read("r1")) == state_b("r1")
        await store.close()

    asyncio.run(scenario())


def test_file_stores_keep_a_blocking_close_for_callers_without_a_loop(tmp_path: Path) -> None:
    """``close_sync`` frees a file store's descriptor where no event loop runs (the sweeps,
    the LangGraph saver's sync API).
    """
    stores: list[FileStore | DirectoryStore] = [
        FileStore(tmp_path / "a", sync=False),
        JournalStore(tmp_path / "b", sync=False),
        DirectoryStore(tmp_path / "c", sync=False),
    ]
    for store in stores:
        before = _open_descriptors()
        asyncio.run(_create_and_close(store))
        assert _open_descriptors() > before
        store.close_sync()
        assert _open_descriptors() == before


async def _create_and_close(store: Store) -> None:
    await (await store.create(state_a("r1"))).close()
