"""Schema migrations on databases made by older durably: nothing saved is lost on the way."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import psycopg
import pytest
from _pg_sql import sql

import durably
from _helpers.samples import state_a, state_b, without_saved_at
from durably.postgres import MIGRATIONS, PostgresStore, _sql, schema
from durably.state import RunState, ToolResult

pytestmark = pytest.mark.postgres


def big_state(run_id: str, line: str) -> RunState:
    """A run holding a 20 KB tool result: large enough to be compressed in its row."""
    state = state_b(run_id)
    state.messages.append(ToolResult(call_id="call_2", name="read_file", content=line * 1000))
    return state


def stored_compression(dsn: str, run_id: str) -> str | None:
    """How the server compressed the run's stored state (None: not compressed)."""
    rows = sql(
        dsn, "SELECT pg_column_compression(state) FROM durably_runs WHERE run_id = %s", run_id
    )
    return str(rows[0][0]) if rows[0][0] is not None else None


def column_compression(dsn: str) -> str:
    """The state column's own setting: '' for the server's default, 'l' for lz4."""
    rows = sql(
        dsn,
        "SELECT attcompression FROM pg_attribute "
        "WHERE attrelid = 'durably_runs'::regclass AND attname = 'state'",
    )
    return str(rows[0][0])


def server_has_lz4(dsn: str) -> bool:
    """Whether the server was built with lz4 (PostgreSQL 14 or newer)."""
    rows = sql(
        dsn,
        "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'",
    )
    return bool(rows and rows[0][0])


def store(dsn: str) -> PostgresStore:
    """A store with a lease that outlasts the test."""
    return PostgresStore(dsn, lease=timedelta(seconds=60))


CREATE_BEFORE_4 = """
INSERT INTO durably_runs (run_id, task, phase, state, saved_at, owner, token, expires_at)
VALUES (%(run_id)s, %(task)s, %(phase)s, %(state)s, now(), %(owner)s, 1, now() + %(lease)s)
ON CONFLICT (run_id) DO NOTHING
RETURNING token
"""
"""How a durably before schema 4 created a run (no summary columns), to make old databases."""


def test_runs_saved_before_the_summary_columns_list_from_their_state_until_saved(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run saved under schema 3 has no summary columns: the listing reads its state for
    them (and says nothing is missing); its next save under schema 4 fills them in.
    """
    old = state_b("old1")
    old.turns, old.resumes = 3, 2
    with monkeypatch.context() as patch:
        patch.setattr(schema, "MIGRATIONS", MIGRATIONS[:3])
        patch.setattr(_sql, "CREATE", CREATE_BEFORE_4)

        async def make() -> None:
            async with store(pg_dsn) as s:
                await (await s.create(old)).close()

        asyncio.run(make())

    async def upgrade() -> tuple[list[tuple[str, int, int]], list[tuple[str, int, int]]]:
        async with store(pg_dsn) as s:
            before = await s.summaries()
            handle, loaded = await s.open("old1")
            loaded.turns = 4
            await handle.save(loaded)
            await handle.close()
            after = await s.summaries()
        return (
            [(x.run_id, x.turns, x.resumes) for x in before.summaries],
            [(x.run_id, x.turns, x.resumes) for x in after.summaries],
        )

    before, after = asyncio.run(upgrade())
    assert before == [("old1", 3, 2)]
    assert after == [("old1", 4, 2)]
    assert sql(pg_dsn, "SELECT turns, resumes FROM durably_runs") == [(4, 2)]


def test_a_database_made_by_schema_1_migrates_and_every_run_loads(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database whose runs were saved under schema 1 (pglz) is migrated by today's store, and
    each run reads, opens and saves as before; only new saves use lz4.
    """
    old = big_state("old1", "an old line of a log file\n")
    with monkeypatch.context() as patch:
        patch.setattr(schema, "MIGRATIONS", MIGRATIONS[:1])
        patch.setattr(_sql, "CREATE", CREATE_BEFORE_4)

        async def make() -> None:
            async with store(pg_dsn) as s:
                await (await s.create(old)).close()
                await (await s.create(state_a("old2"))).close()

        asyncio.run(make())
    assert sql(pg_dsn, "SELECT version FROM durably_schema") == [(1,)]
    assert column_compression(pg_dsn) == ""
    assert stored_compression(pg_dsn, "old1") == "pglz"

    lz4 = server_has_lz4(pg_dsn)
    new = big_state("old1", "a new line of a log file\n")

    async def upgrade() -> None:
        async with store(pg_dsn) as s:
            assert await s.migrate() == MIGRATIONS[-1].version
            assert await s.list_runs() == ["old1", "old2"]
            assert without_saved_at(await s.read("old1")) == without_saved_at(old)
            handle, loaded = await s.open("old1")
            assert without_saved_at(loaded) == without_saved_at(old)
            other, small = await s.open("old2")
            assert without_saved_at(small) == state_a("old2")
            await handle.save(new)
            assert without_saved_at(await s.read("old1")) == without_saved_at(new)
            await handle.close()
            await other.close()

    asyncio.run(upgrade())
    assert sql(pg_dsn, "SELECT version FROM durably_schema ORDER BY version") == [
        (m.version,) for m in MIGRATIONS
    ]
    assert column_compression(pg_dsn) == ("l" if lz4 else "")
    assert stored_compression(pg_dsn, "old1") == ("lz4" if lz4 else "pglz")


def test_a_compression_method_the_server_lacks_leaves_the_column_as_it_was(pg_dsn: str) -> None:
    """Migration 2's statement, given a method the server does not have, changes nothing and
    raises nothing, so the migration goes on (lz4 on a server built without it: the same
    handler, another error code).
    """

    async def migrate() -> None:
        async with store(pg_dsn) as s:
            await s.migrate()

    asyncio.run(migrate())
    sql(pg_dsn, "ALTER TABLE durably_runs ALTER COLUMN state SET COMPRESSION pglz")
    with psycopg.connect(pg_dsn) as conn:  # one transaction, as migrations run
        conn.execute(schema.COMPRESS_STATE.format(method="zstd").encode())
        conn.execute(b"SELECT 1")  # the transaction is still usable
    assert column_compression(pg_dsn) == "p"


def test_runs_saved_before_changes_existed_load_and_go_on_with_changes(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs saved under schema 2 (the whole state in the row) read and open as they were once
    schema 3 is applied, and their next saves are changes on top of the old row; a durably
    that knows only schema 2 then refuses the database rather than read states without
    their changes.
    """
    old = state_b("old1")
    with monkeypatch.context() as patch:
        patch.setattr(schema, "MIGRATIONS", MIGRATIONS[:2])
        patch.setattr(_sql, "CREATE", CREATE_BEFORE_4)

        async def make() -> None:
            async with store(pg_dsn) as s:
                await (await s.create(old)).close()

        asyncio.run(make())
    assert sql(pg_dsn, "SELECT max(version) FROM durably_schema") == [(2,)]
    row = sql(pg_dsn, "SELECT state FROM durably_runs")
    later = state_b("old1")
    later.turns = 2
    later.workspace["notes.md"] = "0" * 64

    async def upgrade() -> None:
        async with store(pg_dsn) as s:
            assert without_saved_at(await s.read("old1")) == without_saved_at(old)
            handle, loaded = await s.open("old1")
            assert without_saved_at(loaded) == without_saved_at(old)
            await handle.save(later)
            assert s.stats.snapshots == 0, "the old row is the snapshot the change goes on"
            assert await s.read("old1") == later
            await handle.close()

    asyncio.run(upgrade())
    assert sql(pg_dsn, "SELECT state, state_seq, seq FROM durably_runs") == [(row[0][0], 0, 1)]
    assert sql(pg_dsn, "SELECT run_id, seq FROM durably_changes") == [("old1", 1)]
    with monkeypatch.context() as patch:
        patch.setattr(schema, "MIGRATIONS", MIGRATIONS[:2])

        async def read_with_schema_2() -> None:
            async with store(pg_dsn) as s:
                await s.read("old1")

        with pytest.raises(durably.CheckpointTooNew):
            asyncio.run(read_with_schema_2())
