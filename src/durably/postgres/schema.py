"""The Postgres store's tables, and the migrations that create and upgrade them.

:data:`MIGRATIONS` is a versioned list. :func:`migrate` applies the steps a
database lacks in one transaction that first takes a transaction-scoped advisory
lock (released at commit, rollback or the death of the process; never a session
lock that a pooled connection would keep), so any number of processes can start
at once. Applied steps are recorded in ``durably_schema``; a database migrated by
a newer durably is refused with ``CheckpointTooNew``. ``docs/postgres.md``
describes the tables.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointTooNew
from ._sql import tuples

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = ["COMPRESS_STATE", "MIGRATIONS", "QUEUED", "Migration", "migrate"]

log = logging.getLogger("durably.store")

QUEUED = "queued"
"""The ``phase`` column of a submitted run that no worker has started yet (no state)."""


@dataclass(frozen=True, kw_only=True)
class Migration:
    """One step of the schema; applied once, in order, recorded in ``durably_schema``."""

    version: int
    description: str
    sql: str


COMPRESS_STATE = """
DO $$
BEGIN
    EXECUTE 'ALTER TABLE durably_runs ALTER COLUMN state SET COMPRESSION {method}';
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value OR syntax_error THEN
    RAISE NOTICE 'durably: the state column keeps the server''s default compression (%)', SQLERRM;
END
$$;
"""
"""Migration 2's statement, for a compression ``method``: a server that lacks it (built
without lz4: ``feature_not_supported``; PostgreSQL 13, which has no ``SET COMPRESSION``:
``syntax_error``) keeps its default (pglz) and the migration still succeeds."""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        version=1,
        description="runs with their lease and the worker queue",
        sql="""
        CREATE TABLE durably_runs (
            run_id     text PRIMARY KEY
                       CHECK (run_id ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
            agent      text,
            task       text NOT NULL,
            phase      text NOT NULL,
            state      bytea,
            created_at timestamptz NOT NULL DEFAULT now(),
            saved_at   timestamptz,
            owner      text,
            token      bigint NOT NULL DEFAULT 0 CHECK (token >= 0),
            expires_at timestamptz,
            parked     text,
            CHECK ((state IS NULL) = (phase = 'queued'))
        );
        CREATE INDEX durably_runs_claimable ON durably_runs (created_at)
            WHERE phase IN ('queued', 'model', 'tools') AND parked IS NULL;
        """,
    ),
    Migration(
        version=2,
        description="the state column compressed with lz4 where the server has it",
        # New values only: rows already saved keep pglz and read as before (each
        # compressed value names its own method).
        sql=COMPRESS_STATE.format(method="lz4"),
    ),
    Migration(
        version=3,
        description="saves as changes since the last snapshot",
        # A row's state is the snapshot of save state_seq; the changes of saves
        # state_seq+1 ... seq are rows of durably_changes. Rows saved before keep
        # their state as the whole truth (both numbers 0, no changes). A durably
        # that knows only version 2 refuses the database (it would read snapshots
        # without their changes).
        sql="""
        ALTER TABLE durably_runs
            ADD COLUMN seq bigint NOT NULL DEFAULT 0,
            ADD COLUMN state_seq bigint NOT NULL DEFAULT 0,
            ADD CONSTRAINT durably_runs_seq CHECK (0 <= state_seq AND state_seq <= seq);
        CREATE TABLE durably_changes (
            run_id text NOT NULL,
            seq    bigint NOT NULL CHECK (seq > 0),
            change bytea NOT NULL,
            PRIMARY KEY (run_id, seq)
        );
        """,
    ),
    Migration(
        version=4,
        description="run summaries in columns, and the workers with their heartbeats",
        # The listing reads these columns, never the states. Each save writes them;
        # rows saved before keep NULLs until their next save (the listing reads their
        # state then). A worker's row says which agents it serves; it is live while
        # expires_at is ahead of the database clock (each heartbeat moves it on).
        sql="""
        ALTER TABLE durably_runs
            ADD COLUMN turns int,
            ADD COLUMN dollars double precision,
            ADD COLUMN resumes int;
        CREATE TABLE durably_workers (
            owner       text PRIMARY KEY,
            agents      text[] NOT NULL,
            concurrency int NOT NULL,
            started_at  timestamptz NOT NULL DEFAULT now(),
            seen_at     timestamptz NOT NULL DEFAULT now(),
            expires_at  timestamptz NOT NULL
        );
        """,
    ),
    Migration(
        version=5,
        description="LangGraph threads: their leases, checkpoints, channel values and writes",
        # PostgresThreadSaver's tables (durably.langgraph). A thread's lease is its row
        # of durably_lg_threads; every write names the row's fencing token and locks
        # the row (FOR SHARE) in the same statement, so a takeover (which bumps the
        # token) waits for a write in flight and refuses every later one. A blob whose
        # base is not NULL holds only the items appended to the blob of that version.
        sql="""
        CREATE TABLE durably_lg_threads (
            thread_id  text PRIMARY KEY,
            owner      text,
            token      bigint NOT NULL DEFAULT 0 CHECK (token >= 0),
            expires_at timestamptz,
            created_at timestamptz NOT NULL DEFAULT now()
        );
        CREATE TABLE durably_lg_checkpoints (
            thread_id     text NOT NULL,
            ns            text NOT NULL,
            checkpoint_id text NOT NULL,
            parent_id     text,
            run_id        text,
            type          text NOT NULL,
            checkpoint    bytea NOT NULL,
            meta_type     text NOT NULL,
            metadata      bytea NOT NULL,
            saved_at      timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (thread_id, ns, checkpoint_id)
        );
        CREATE TABLE durably_lg_blobs (
            thread_id text NOT NULL,
            ns        text NOT NULL,
            channel   text NOT NULL,
            version   text NOT NULL,
            type      text NOT NULL,
            data      bytea NOT NULL,
            base      text,
            PRIMARY KEY (thread_id, ns, channel, version)
        );
        CREATE TABLE durably_lg_writes (
            thread_id     text NOT NULL,
            ns            text NOT NULL,
            checkpoint_id text NOT NULL,
            task_id       text NOT NULL,
            idx           int NOT NULL,
            channel       text NOT NULL,
            type          text NOT NULL,
            data          bytea NOT NULL,
            task_path     text NOT NULL DEFAULT '',
            PRIMARY KEY (thread_id, ns, checkpoint_id, task_id, idx)
        );
        """,
    ),
    Migration(
        version=6,
        description="cancel requests, and the finished runs prune deletes by age",
        # durably cancel sets cancel_requested on a run a live lease holds; its owner's
        # next save returns it and the engine ends the run as cancelled. A run nobody
        # holds is saved as cancelled at once (phase 'cancelled', which no claim picks).
        # prune deletes finished runs oldest first: the index keeps that a range scan.
        sql="""
        ALTER TABLE durably_runs ADD COLUMN cancel_requested timestamptz;
        CREATE INDEX durably_runs_finished ON durably_runs (saved_at)
            WHERE phase IN ('done', 'cancelled');
        """,
    ),
    Migration(
        version=7,
        description="saves update the run's row in place (HOT): no index names what a save moves",
        # Every save sets saved_at and most move phase (model, tools); version 6's indexes
        # named both (the finished index by key, the claimable one in its predicate), so
        # no save could be a heap-only update: each wrote a new entry into every index of
        # durably_runs, in its WAL too. The indexes now name two generated columns that
        # change only when a run stops or starts being claimable or finishes. Adding a
        # stored generated column rewrites the table once, under its exclusive lock.
        sql="""
        ALTER TABLE durably_runs
            ADD COLUMN claimable boolean GENERATED ALWAYS AS
                (phase IN ('queued', 'model', 'tools') AND parked IS NULL) STORED,
            ADD COLUMN finished_at timestamptz GENERATED ALWAYS AS
                (CASE WHEN phase IN ('done', 'cancelled') THEN saved_at END) STORED;
        DROP INDEX durably_runs_claimable;
        DROP INDEX durably_runs_finished;
        CREATE INDEX durably_runs_claimable ON durably_runs (created_at) WHERE claimable;
        CREATE INDEX durably_runs_finished ON durably_runs (finished_at)
            WHERE finished_at IS NOT NULL;
        """,
    ),
)
"""The schema, step by step. Append new steps; never edit an applied one."""

_SCHEMA_LOCK = 0x64757261626C7931  # "durably1": the advisory lock serializing migrations


async def migrate(conn: AsyncConnection[tuple[Any, ...]], *, where: str) -> None:
    """Bring the schema up to :data:`MIGRATIONS`, under the migration lock when needed.

    Args:
        conn: a connection to the database, in the schema to migrate.
        where: the database, for messages.

    Raises:
        CheckpointTooNew: a newer durably migrated the database further.
    """
    latest = MIGRATIONS[-1].version
    if not conn.autocommit:
        await conn.commit()
    # Fast path: an up-to-date schema needs no lock.
    cursor = await tuples(conn).execute("SELECT to_regclass('durably_schema') IS NOT NULL")
    exists = await cursor.fetchone()
    if exists is not None and exists[0]:
        cursor = await tuples(conn).execute("SELECT coalesce(max(version), 0) FROM durably_schema")
        row = await cursor.fetchone()
        if row is not None and int(row[0]) == latest:
            return
    async with conn.transaction():
        # Transaction-scoped: released at commit or rollback, or when this process
        # dies; never a session lock that a pooled connection would keep.
        await tuples(conn).execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        await tuples(conn).execute(
            "CREATE TABLE IF NOT EXISTS durably_schema ("
            " version int PRIMARY KEY,"
            " description text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        cursor = await tuples(conn).execute("SELECT coalesce(max(version), 0) FROM durably_schema")
        found = await cursor.fetchone()
        current = int(found[0]) if found is not None else 0
        if current > latest:
            raise CheckpointTooNew(path=f"{where} durably_schema", found=current, known=latest)
        for step in MIGRATIONS:
            if step.version <= current:
                continue
            await tuples(conn).execute(step.sql)
            await tuples(conn).execute(
                "INSERT INTO durably_schema (version, description) VALUES (%s, %s)",
                (step.version, step.description),
            )
            log.info("durably schema migrated to version %d", step.version)
