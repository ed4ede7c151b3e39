"""The Postgres store's SQL: every statement it sends, and what a row holds of a run.

Each statement that writes is conditional on the run's fencing token (and, but for a
release, on an unexpired lease), so sending it again, as a retry after a broken
connection does, never writes over another owner's run. Their texts are constants
here, read when a statement is sent (tests slow one down or break its fencing).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from psycopg import AsyncConnection, AsyncCursor

__all__ = [
    "ACQUIRE",
    "CANCEL_ASK",
    "CANCEL_LOCK",
    "CANCEL_NOW",
    "CREATE",
    "CREATED_MINE",
    "HOLDER",
    "LIST",
    "PRUNE",
    "PRUNE_OWNED",
    "READ",
    "RELEASE",
    "RENEW",
    "SAVE_CHANGE",
    "SAVE_MANY",
    "SAVE_STATE",
    "STORED",
    "WHY_NOT",
    "Landed",
    "cursor_of",
    "fetchone",
    "saving",
    "tuples",
]

CREATE = """
INSERT INTO durably_runs (run_id, task, phase, state, saved_at, owner, token, expires_at,
                          turns, dollars, resumes)
VALUES (%(run_id)s, %(task)s, %(phase)s, %(state)s, now(), %(owner)s, 1, now() + %(lease)s,
        %(turns)s, %(dollars)s, %(resumes)s)
ON CONFLICT (run_id) DO NOTHING
RETURNING token
"""

CREATED_MINE = (
    "SELECT token FROM durably_runs WHERE run_id = %(run_id)s "
    "AND owner = %(owner)s AND state = %(state)s AND expires_at > now()"
)
"""After a retried :data:`CREATE` found the ID taken: whether an earlier attempt of this
store's made the row (it committed before its connection broke)."""

STORED = """r.state, r.state_seq, r.seq, ARRAY(
    SELECT c.change FROM durably_changes AS c
    WHERE c.run_id = r.run_id AND c.seq > r.state_seq ORDER BY c.seq)"""
"""What a row holds of its run's state (:class:`~durably.postgres._rows.Stored`): the
snapshot, its save number, the last save's number, and the changes since the snapshot,
in order. Only ever in a
``SELECT``, which reads the row and the changes from one snapshot of the database;
never in the ``RETURNING`` of an ``UPDATE``, which may wait for a save in flight and
then return that save's row with the changes of the older snapshot it began with."""

ACQUIRE = """
UPDATE durably_runs
SET owner = %(owner)s, token = token + 1, expires_at = now() + %(lease)s
WHERE run_id = %(run_id)s AND state IS NOT NULL
  AND (expires_at IS NULL OR expires_at <= now())
RETURNING token
"""
"""Take a run's lease; its state is read after, by :data:`READ`: once the token has
moved, no save of an earlier owner can land, and a statement begun after the
acquisition's commit sees every save that did."""

WHY_NOT = """
SELECT state IS NULL, owner, expires_at, expires_at > now() FROM durably_runs
WHERE run_id = %(run_id)s
"""

SAVE_CHANGE = """
WITH saved AS (
    UPDATE durably_runs
    SET phase = %(phase)s, saved_at = now(), parked = NULL, seq = %(seq)s,
        turns = %(turns)s, dollars = %(dollars)s, resumes = %(resumes)s
    WHERE run_id = %(run_id)s AND token = %(token)s AND expires_at > now()
      AND seq IN (%(seq)s - 1, %(seq)s)
    RETURNING run_id, cancel_requested IS NOT NULL AS cancel
), added AS (
    INSERT INTO durably_changes (run_id, seq, change)
    SELECT run_id, %(seq)s, %(change)s FROM saved
    ON CONFLICT (run_id, seq) DO NOTHING
)
SELECT run_id, cancel FROM saved
"""
"""One run's save as its change: the row's ``seq`` moves on and the change is a new row of
``durably_changes``, in one statement and one commit, conditional on the token and the
lease; the big snapshot is not written again. The row's ``seq`` must be the save
before this one, or this one: a save sent again after its first try landed unseen
(a broken connection) finds its change there and adds nothing."""

SAVE_STATE = """
WITH saved AS (
    UPDATE durably_runs
    SET state = %(state)s, state_seq = %(seq)s, seq = %(seq)s, phase = %(phase)s,
        saved_at = now(), parked = NULL,
        turns = %(turns)s, dollars = %(dollars)s, resumes = %(resumes)s
    WHERE run_id = %(run_id)s AND token = %(token)s AND expires_at > now()
      AND seq IN (%(seq)s - 1, %(seq)s)
    RETURNING run_id, cancel_requested IS NOT NULL AS cancel
), dropped AS (
    DELETE FROM durably_changes AS c USING saved WHERE c.run_id = saved.run_id
)
SELECT run_id, cancel FROM saved
"""
"""One run's save as a new snapshot: the whole state, and the run's changes deleted, in
one statement conditional on the token, the lease and the save number as
:data:`SAVE_CHANGE` is. Sent again after it landed unseen, it writes the same snapshot."""

SAVE_MANY = """
WITH v AS (
    SELECT * FROM unnest(%(run_ids)b::text[], %(tokens)b::bigint[], %(seqs)b::bigint[],
                         %(phases)b::text[], %(states)b::bytea[], %(changes)b::bytea[],
                         %(turns)b::int[], %(dollars)b::float8[], %(resumes)b::int[])
        AS v(run_id, token, seq, phase, state, change, turns, dollars, resumes)
), saved AS (
    UPDATE durably_runs AS r
    SET phase = v.phase, saved_at = now(), parked = NULL, seq = v.seq,
        turns = v.turns, dollars = v.dollars, resumes = v.resumes,
        state = CASE WHEN v.state IS NULL THEN r.state ELSE v.state END,
        state_seq = CASE WHEN v.state IS NULL THEN r.state_seq ELSE v.seq END
    FROM v
    WHERE r.run_id = v.run_id AND r.token = v.token AND r.expires_at > now()
      AND r.seq IN (v.seq - 1, v.seq)
    RETURNING r.run_id, v.seq, v.state IS NOT NULL AS whole, v.change,
              r.cancel_requested IS NOT NULL AS cancel
), dropped AS (
    DELETE FROM durably_changes AS c USING saved
    WHERE saved.whole AND c.run_id = saved.run_id
), added AS (
    INSERT INTO durably_changes (run_id, seq, change)
    SELECT run_id, seq, change FROM saved WHERE NOT saved.whole
    ON CONFLICT (run_id, seq) DO NOTHING
)
SELECT run_id, cancel FROM saved
"""
"""The saves of several runs in one statement and one commit, each row conditional on its
own token, lease and save number exactly as a lone save's is; the result names the rows
that landed, each with whether ``durably cancel`` asked its owner to stop. A save with a
``state`` is a snapshot, as :data:`SAVE_STATE` writes one; the others are changes, as
:data:`SAVE_CHANGE` writes one."""

RENEW = """
UPDATE durably_runs AS r SET expires_at = now() + %(lease)s
FROM unnest(%(run_ids)s::text[], %(tokens)s::bigint[]) AS v(run_id, token)
WHERE r.run_id = v.run_id AND r.token = v.token AND r.expires_at > now()
RETURNING r.run_id
"""
"""Renew the leases of several runs in one statement and one commit, each row on its own
condition (its token, an unexpired lease); the result names the runs renewed."""

RELEASE = """
UPDATE durably_runs SET expires_at = NULL
WHERE run_id = %(run_id)s AND token = %(token)s
"""

HOLDER = """
SELECT owner, token, coalesce(expires_at > now(), false) FROM durably_runs
WHERE run_id = %(run_id)s
"""
"""Who holds a run's lease now (its owner, token, and whether it is live): to word
``LeaseLost`` once a save or renewal found the lease gone."""

CANCEL_LOCK = """
SELECT phase, coalesce(expires_at > now(), false), task, created_at
FROM durably_runs WHERE run_id = %(run_id)s
FOR UPDATE
"""
"""A run's phase, whether a live lease holds it, and what a queued run has: the row locked
until the cancel's transaction ends, so no claim, save or acquisition lands meanwhile."""

CANCEL_ASK = """
UPDATE durably_runs SET cancel_requested = coalesce(cancel_requested, now())
WHERE run_id = %(run_id)s
"""
"""Ask the owner of a run a live lease holds to stop: its next save returns the request."""

CANCEL_NOW = """
WITH saved AS (
    UPDATE durably_runs
    SET state = %(state)s, state_seq = %(seq)s, seq = %(seq)s, phase = 'cancelled',
        saved_at = now(), token = token + 1, owner = NULL, expires_at = NULL,
        cancel_requested = coalesce(cancel_requested, now()),
        turns = %(turns)s, dollars = %(dollars)s, resumes = %(resumes)s
    WHERE run_id = %(run_id)s
    RETURNING run_id
)
DELETE FROM durably_changes AS c USING saved WHERE c.run_id = saved.run_id
"""
"""Save a run nobody holds as cancelled: a new snapshot, its changes deleted, and the token
moved on, so a stalled earlier owner's save or renewal can never land after it."""

PRUNE = """
WITH doomed AS (
    SELECT run_id FROM durably_runs
    WHERE finished_at < coalesce(%(now)s::timestamptz, now()) - %(older_than)s::interval
      AND (expires_at IS NULL OR expires_at <= now())
    ORDER BY finished_at, run_id
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), changes AS (
    DELETE FROM durably_changes AS c USING doomed WHERE c.run_id = doomed.run_id
)
DELETE FROM durably_runs AS r USING doomed WHERE r.run_id = doomed.run_id
RETURNING r.run_id
"""
"""Delete up to ``batch`` finished runs saved ``older_than`` before ``now`` (default: the
database clock's) that no live lease holds,
with their changes, in one statement (one transaction: each run whole or gone). Rows
another transaction has locked (a cancel, a claim) are skipped, left for the next prune."""

PRUNE_OWNED = """
SELECT run_id FROM durably_runs
WHERE finished_at < coalesce(%(now)s::timestamptz, now()) - %(older_than)s::interval
  AND expires_at > now()
ORDER BY run_id
"""
"""Finished runs old enough to prune that a live lease still holds (their owner is closing)."""

READ = f"SELECT r.run_id, {STORED} FROM durably_runs AS r WHERE r.run_id = ANY(%(run_ids)s)"  # noqa: S608 -- built from this module's constants only
LIST = "SELECT run_id FROM durably_runs WHERE state IS NOT NULL"


Landed = dict[str, bool]
"""The runs whose saves landed, each with whether a cancel was requested for it."""


def saving(
    saves: list[dict[str, Any]],
) -> Callable[[AsyncConnection[tuple[Any, ...]]], Awaitable[Landed]]:
    """The statement that sends ``saves`` (of distinct runs): it returns the runs that landed.

    One save goes as :data:`SAVE_CHANGE` or :data:`SAVE_STATE`; several as
    :data:`SAVE_MANY`.
    """
    if len(saves) == 1:
        params = saves[0]
        statement = SAVE_STATE if params["change"] is None else SAVE_CHANGE

        async def one(conn: AsyncConnection[tuple[Any, ...]]) -> Landed:
            cursor = await cursor_of(conn).execute(statement, params)
            return {str(row[0]): bool(row[1]) for row in await cursor.fetchall()}

        return one
    columns = {
        "run_ids": [p["run_id"] for p in saves],
        "tokens": [p["token"] for p in saves],
        "seqs": [p["seq"] for p in saves],
        "phases": [p["phase"] for p in saves],
        "states": [p["state"] for p in saves],
        "changes": [p["change"] for p in saves],
        "turns": [p["turns"] for p in saves],
        "dollars": [p["dollars"] for p in saves],
        "resumes": [p["resumes"] for p in saves],
    }

    async def many(conn: AsyncConnection[tuple[Any, ...]]) -> Landed:
        cursor = await cursor_of(conn).execute(SAVE_MANY, columns)
        return {str(row[0]): bool(row[1]) for row in await cursor.fetchall()}

    return many


async def fetchone(
    conn: AsyncConnection[tuple[Any, ...]], sql: str, params: dict[str, Any]
) -> tuple[Any, ...] | None:
    cursor = await cursor_of(conn).execute(sql, params)
    return await cursor.fetchone()


_CURSOR = "_durably_cursor"


def cursor_of(conn: AsyncConnection[Any]) -> AsyncCursor[tuple[Any, ...]]:
    """The cursor durably sends its frequent statements (saves, renewals) with on ``conn``.

    Made once per connection (with tuple rows) and kept on it: a new cursor per
    statement, as ``conn.execute`` makes, sets psycopg's adapters up again each time,
    about 20 us of CPU a save (docs/design.md, "A save's own CPU"). A connection is
    used by one task at a time (it is taken from the pool), so one cursor is never in
    two statements at once; each caller reads its rows before the next statement.
    """
    cursor: AsyncCursor[tuple[Any, ...]] | None = getattr(conn, _CURSOR, None)
    if cursor is None or cursor.closed:
        from psycopg.rows import tuple_row

        cursor = conn.cursor(row_factory=tuple_row)
        setattr(conn, _CURSOR, cursor)
    return cursor


def tuples(conn: AsyncConnection[Any]) -> AsyncCursor[tuple[Any, ...]]:
    """A new cursor on ``conn`` whose rows are tuples, whatever the pool's row factory.

    For the statements sent now and then (claims, listings, migrations); the frequent
    ones use :func:`cursor_of`. A new cursor lets go of its rows with itself, where a
    kept one would hold a big result (a listing, a state) until its next statement.
    """
    from psycopg.rows import tuple_row

    return conn.cursor(row_factory=tuple_row)
