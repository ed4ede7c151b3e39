"""The SQL the Postgres thread saver runs, and the migration that makes its tables.

Every statement that writes takes the thread's row ``FOR SHARE`` on the condition that
the lease is still the writer's (see :mod:`._postgres`); the tables are migration 5 of
:mod:`durably.postgres.schema`.
"""

from __future__ import annotations

import asyncio
import threading

__all__ = [
    "BLOBS",
    "CLAIM",
    "COPY_THREAD",
    "DELETE_FOR_RUNS",
    "DELETE_THREAD",
    "FENCE",
    "GET",
    "KEEP_LATEST",
    "PUT",
    "PUT_NEW",
    "PUT_WRITES",
    "PUT_WRITES_KEPT",
    "PUT_WRITES_NEW",
    "RELEASE",
    "RENEW",
    "WRITES",
    "migrate_schema",
]

CLAIM = """
INSERT INTO durably_lg_threads (thread_id, owner, token, expires_at)
VALUES (%(thread_id)s, %(owner)s, 1, now() + %(lease)s)
ON CONFLICT (thread_id) DO UPDATE
SET owner = EXCLUDED.owner, token = durably_lg_threads.token + 1,
    expires_at = EXCLUDED.expires_at
WHERE durably_lg_threads.expires_at IS NULL OR durably_lg_threads.expires_at <= now()
RETURNING token
"""
"""Take a thread's lease if it is free or expired; no row back means another holds it."""

RENEW = """
UPDATE durably_lg_threads AS t SET expires_at = now() + %(lease)s
FROM unnest(%(thread_ids)s::text[], %(tokens)s::bigint[]) AS v(thread_id, token)
WHERE t.thread_id = v.thread_id AND t.token = v.token AND t.expires_at > now()
RETURNING t.thread_id
"""

RELEASE = """
UPDATE durably_lg_threads SET expires_at = NULL
WHERE thread_id = %(thread_id)s AND token = %(token)s
"""

FENCE = """
fence AS (
    SELECT thread_id FROM durably_lg_threads
    WHERE thread_id = %(thread_id)s AND token = %(token)s AND expires_at > now()
    FOR SHARE
)"""
"""The lease check every write starts with: the thread's row, locked against a takeover
until the statement commits, only while the token is this saver's and the lease runs."""

_PUT = """
WITH {fence}, latest AS (
    SELECT max(checkpoint_id) AS id FROM durably_lg_checkpoints
    WHERE thread_id = %(thread_id)s AND ns = %(ns)s
), ok AS (
    SELECT fence.thread_id FROM fence, latest
    WHERE NOT %(check)s OR latest.id IS NULL OR latest.id IS NOT DISTINCT FROM %(parent)s
), cp AS (
    INSERT INTO durably_lg_checkpoints
        (thread_id, ns, checkpoint_id, parent_id, run_id, type, checkpoint, meta_type, metadata)
    SELECT thread_id, %(ns)s, %(id)s, %(parent)s, %(run_id)s, %(type)s, %(checkpoint)s,
           %(meta_type)s, %(metadata)s
    FROM ok{checkpoint_conflict}
), bl AS (
    INSERT INTO durably_lg_blobs (thread_id, ns, channel, version, type, data, base)
    SELECT ok.thread_id, %(ns)s, b.channel, b.version, b.type, b.data, b.base
    FROM ok, unnest(%(channels)s::text[], %(versions)s::text[], %(types)s::text[],
                    %(datas)s::bytea[], %(bases)s::text[])
         AS b(channel, version, type, data, base){blob_conflict}
)
SELECT (SELECT count(*) FROM fence), (SELECT count(*) FROM ok), (SELECT id FROM latest)
"""

PUT = _PUT.format(
    fence=FENCE,
    checkpoint_conflict="""
    ON CONFLICT (thread_id, ns, checkpoint_id) DO UPDATE
    SET parent_id = EXCLUDED.parent_id, run_id = EXCLUDED.run_id, type = EXCLUDED.type,
        checkpoint = EXCLUDED.checkpoint, meta_type = EXCLUDED.meta_type,
        metadata = EXCLUDED.metadata""",
    blob_conflict="""
    ON CONFLICT (thread_id, ns, channel, version) DO NOTHING""",
)
"""A checkpoint and its new channel values, fenced and checked against the latest, in one
statement: the first count is 0 when the lease is gone, the second when the put is stale.
A checkpoint put again replaces its row and keeps the values stored."""

PUT_NEW = _PUT.format(fence=FENCE, checkpoint_conflict="", blob_conflict="")
""":data:`PUT` for a checkpoint not stored yet, as nearly every put is: plain inserts,
where ``ON CONFLICT`` makes each row a speculative insertion (an index probe first and
a confirm record in the WAL after). A put that finds its rows there fails with a
unique violation, writes nothing, and is sent again as :data:`PUT`."""

_PUT_WRITES = """
WITH {fence}, upserted AS (
    INSERT INTO durably_lg_writes
        (thread_id, ns, checkpoint_id, task_id, idx, channel, type, data, task_path)
    SELECT fence.thread_id, %(ns)s, %(checkpoint_id)s, %(task_id)s, w.idx, w.channel,
           w.type, w.data, %(task_path)s
    FROM fence, unnest(%(idxs)s::int[], %(channels)s::text[], %(types)s::text[],
                       %(datas)s::bytea[]) AS w(idx, channel, type, data){conflict}
)
SELECT count(*) FROM fence
"""

PUT_WRITES = _PUT_WRITES.format(
    fence=FENCE,
    conflict="""
    ON CONFLICT (thread_id, ns, checkpoint_id, task_id, idx) DO UPDATE
    SET channel = EXCLUDED.channel, type = EXCLUDED.type, data = EXCLUDED.data,
        task_path = EXCLUDED.task_path""",
)
"""A task's special writes (idx < 0: an error, an interrupt, a resume), fenced; they
replace what the task wrote before at the same index."""

PUT_WRITES_KEPT = _PUT_WRITES.format(
    fence=FENCE,
    conflict="""
    ON CONFLICT (thread_id, ns, checkpoint_id, task_id, idx) DO NOTHING""",
)
"""A task's regular writes, fenced; one stored before is kept, never replaced."""

PUT_WRITES_NEW = _PUT_WRITES.format(fence=FENCE, conflict="")
""":data:`PUT_WRITES_KEPT` for writes not stored yet, with plain inserts (as
:data:`PUT_NEW`); one that finds a write there fails, writes nothing, and is sent again
as :data:`PUT_WRITES_KEPT`."""

GET = """
SELECT ns, checkpoint_id, parent_id, type, checkpoint, meta_type, metadata
FROM durably_lg_checkpoints WHERE thread_id = %(thread_id)s AND ns = %(ns)s
"""

BLOBS = """
WITH RECURSIVE chain AS (
    SELECT b.channel, b.version, b.type, b.data, b.base, 0 AS depth, b.version AS wanted
    FROM durably_lg_blobs AS b
    JOIN unnest(%(channels)s::text[], %(versions)s::text[]) AS w(channel, version)
      ON b.channel = w.channel AND b.version = w.version
    WHERE b.thread_id = %(thread_id)s AND b.ns = %(ns)s
    UNION ALL
    SELECT b.channel, b.version, b.type, b.data, b.base, c.depth + 1, c.wanted
    FROM durably_lg_blobs AS b JOIN chain AS c
      ON b.thread_id = %(thread_id)s AND b.ns = %(ns)s AND b.channel = c.channel
     AND b.version = c.base
)
SELECT channel, type, data, depth FROM chain ORDER BY channel, depth DESC
"""
"""The blobs of a checkpoint's channel versions, each with the chain of blobs it extends."""

WRITES = """
SELECT task_id, idx, channel, type, data, task_path FROM durably_lg_writes
WHERE thread_id = %(thread_id)s AND ns = %(ns)s AND checkpoint_id = %(checkpoint_id)s
"""


DELETE_THREAD = (
    "DELETE FROM durably_lg_checkpoints WHERE thread_id = %(t)s",
    "DELETE FROM durably_lg_blobs WHERE thread_id = %(t)s",
    "DELETE FROM durably_lg_writes WHERE thread_id = %(t)s",
)
"""A thread's checkpoints, values and writes deleted (one transaction; its lease row stays)."""

DELETE_FOR_RUNS = """
WITH gone AS (
    DELETE FROM durably_lg_checkpoints WHERE run_id = ANY(%(r)s)
    RETURNING thread_id, ns, checkpoint_id
)
DELETE FROM durably_lg_writes AS w USING gone
WHERE w.thread_id = gone.thread_id AND w.ns = gone.ns AND w.checkpoint_id = gone.checkpoint_id
"""
"""The checkpoints whose metadata names one of the runs ``r``, with their writes."""

COPY_THREAD = (
    """
    INSERT INTO durably_lg_checkpoints (thread_id, ns, checkpoint_id, parent_id, run_id, type,
                                        checkpoint, meta_type, metadata)
    SELECT %(t)s, ns, checkpoint_id, parent_id, run_id, type, checkpoint, meta_type, metadata
    FROM durably_lg_checkpoints WHERE thread_id = %(s)s ON CONFLICT DO NOTHING
    """,
    """
    INSERT INTO durably_lg_blobs (thread_id, ns, channel, version, type, data, base)
    SELECT %(t)s, ns, channel, version, type, data, base FROM durably_lg_blobs
    WHERE thread_id = %(s)s ON CONFLICT DO NOTHING
    """,
    """
    INSERT INTO durably_lg_writes (thread_id, ns, checkpoint_id, task_id, idx, channel, type,
                                   data, task_path)
    SELECT %(t)s, ns, checkpoint_id, task_id, idx, channel, type, data, task_path
    FROM durably_lg_writes WHERE thread_id = %(s)s ON CONFLICT DO NOTHING
    """,
)
"""Thread ``s`` copied into thread ``t`` (one transaction; rows ``t`` has already kept)."""

KEEP_LATEST = """
WITH keep AS (
    SELECT thread_id, ns, max(checkpoint_id) AS id FROM durably_lg_checkpoints
    WHERE thread_id = ANY(%(t)s) GROUP BY thread_id, ns
), gone AS (
    DELETE FROM durably_lg_checkpoints AS c USING keep
    WHERE c.thread_id = keep.thread_id AND c.ns = keep.ns AND c.checkpoint_id <> keep.id
    RETURNING c.thread_id, c.ns, c.checkpoint_id
)
DELETE FROM durably_lg_writes AS w USING gone
WHERE w.thread_id = gone.thread_id AND w.ns = gone.ns AND w.checkpoint_id = gone.checkpoint_id
"""
"""Each namespace of the threads ``t`` down to its latest checkpoint, with its writes."""


def migrate_schema(dsn: str, where: str) -> None:
    """Migrate the schema (durably's migrations are async), in a thread of its own."""
    failed: list[BaseException] = []

    async def run() -> None:
        from psycopg import AsyncConnection

        from ..postgres.schema import migrate

        async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
            await migrate(conn, where=where)

    def target() -> None:
        try:
            asyncio.run(run())
        except BaseException as exc:  # noqa: BLE001 - the loop's thread hands whatever ended it to the caller
            failed.append(exc)

    worker = threading.Thread(target=target, name="durably-langgraph-migrate")
    worker.start()
    worker.join()
    if failed:
        raise failed[0]
