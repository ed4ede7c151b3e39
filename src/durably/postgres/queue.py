"""The work queue: runs submitted for workers, claimed by them, parked for a person.

A *queued* run is a row with an agent's name and a task and no state yet
(:func:`enqueue`). Workers :func:`claim` runs of the agents they know whose lease
is absent or expired (queued ones, and started ones whose process died), in one
``UPDATE`` over ``SELECT ... FOR UPDATE SKIP LOCKED`` that takes their leases.
A run a retry cannot help is :func:`park`-ed: no worker claims it again until a
person resumes it (its next save clears the mark).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import RunExists
from ..keys import validate_run_id
from ..state import RunState
from . import _sql
from .store import PostgresRun, PostgresStore, Stored

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = ["RUNS_TO_CLAIM", "Claim", "claim", "enqueue", "park"]

_ENQUEUE = """
INSERT INTO durably_runs (run_id, agent, task, phase)
VALUES (%(run_id)s, %(agent)s, %(task)s, 'queued')
ON CONFLICT (run_id) DO NOTHING
RETURNING run_id
"""

RUNS_TO_CLAIM = """
WITH picked AS (
    SELECT run_id, owner AS was_owner, expires_at AS was_expiring FROM durably_runs
    WHERE claimable
      AND agent = ANY(%(agents)s)
      AND (expires_at IS NULL OR expires_at <= now())
    ORDER BY created_at, run_id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE durably_runs AS r
SET owner = %(owner)s, token = r.token + 1, expires_at = now() + %(lease)s
FROM picked
WHERE r.run_id = picked.run_id
RETURNING r.run_id, r.agent, r.task, r.token, r.state IS NULL,
          picked.was_owner, extract(epoch FROM now() - picked.was_expiring)
"""
"""Claim up to ``limit`` runs of the given agents that are not done, not waiting for a
person, not parked, and whose lease is absent or expired. ``SKIP LOCKED`` lets any
number of workers claim at once without waiting on each other's rows. Each row also
says who held it before and how long ago that lease expired (NULL: it was handed back
or never held)."""

_PARK = """
UPDATE durably_runs SET parked = %(reason)s
WHERE run_id = %(run_id)s AND token = %(token)s
"""


@dataclass(kw_only=True)
class Claim:
    """A run a worker took the lease of: what to run, and the handle that owns it."""

    run_id: str
    agent: str
    """The registered name of the agent that runs it."""
    task: str
    handle: PostgresRun
    stored: Stored | None = field(repr=False)
    """What the row holds of the state; None for a queued run that no worker has started."""
    previous_owner: str | None = None
    """Who held the lease before this claim (None: nobody ever did)."""
    expired_ago: float | None = None
    """Seconds since the previous lease expired, by the database clock; None when it
    was handed back (freed) rather than left to expire."""

    def load(self) -> RunState | None:
        """The run's state (None when queued); ``CheckpointCorrupt`` if it cannot be read."""
        if self.stored is None:
            return None
        return self.handle.store.decode(self.run_id, self.stored)


async def enqueue(store: PostgresStore, *, run_id: str, agent: str, task: str) -> None:
    """Record a run for a worker to start: its agent's name and its task, no state yet.

    Args:
        store: the store workers claim from.
        run_id: the new run's ID.
        agent: the registered name of the agent that will run it.
        task: the run's first user message.

    Raises:
        RunExists: the ID was ever used in this store.
    """
    validate_run_id(run_id)
    params = {"run_id": run_id, "agent": agent, "task": task}

    async def insert(conn: AsyncConnection[tuple[Any, ...]]) -> bool:
        cursor = await _sql.tuples(conn).execute(_ENQUEUE, params)
        return await cursor.fetchone() is not None

    if not await store.execute(insert, what=f"submitting run {run_id!r}", run_id=run_id):
        raise RunExists(run_id=run_id)


async def claim(store: PostgresStore, *, agents: Sequence[str], limit: int) -> list[Claim]:
    """Take the leases of up to ``limit`` runs a worker should carry on (:data:`RUNS_TO_CLAIM`).

    Args:
        store: the store to claim from.
        agents: only runs recorded with one of these agent names are claimed.
        limit: the most runs to claim.

    Returns:
        The claims, oldest run first; each holds an open handle that renews its
        lease until the caller closes it.
    """
    if limit <= 0 or not agents:
        return []
    sent = time.monotonic()
    params = {"agents": list(agents), "limit": limit, "owner": store.owner, "lease": store.lease}

    async def update(conn: AsyncConnection[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        cursor = await _sql.tuples(conn).execute(RUNS_TO_CLAIM, params)
        return await cursor.fetchall()

    rows = await store.execute(update, what="claiming runs")
    started = [row[0] for row in rows if not row[4]]
    try:
        # Read once the leases are ours: no earlier owner's save can land after it.
        stored = await store.stored(started) if started else {}
    except BaseException:
        for run_id, _, _, token, *_ in rows:  # hand the leases back
            await store.adopt(run_id, int(token), sent=sent).close()
        raise
    return [
        Claim(
            run_id=run_id,
            agent=agent,
            task=task,
            handle=store.adopt(
                run_id, int(token), sent=sent, seq=stored[run_id].seq if run_id in stored else 0
            ),
            stored=stored.get(run_id),
            previous_owner=was_owner,
            expired_ago=float(ago) if ago is not None else None,
        )
        for run_id, agent, task, token, _, was_owner, ago in rows
    ]


async def park(handle: PostgresRun, reason: str) -> bool:
    """Stop workers from claiming the run again (a person must look); True if recorded.

    Works after the handle was closed too, as long as no other process has taken
    the run since (the statement is conditional on the handle's token).

    Args:
        handle: the handle that holds (or last held) the run's lease.
        reason: why, for the person; kept to its first 2,000 characters.
    """
    params = {"run_id": handle.run_id, "token": handle.token, "reason": reason[:2000]}

    async def update(conn: AsyncConnection[tuple[Any, ...]]) -> int:
        cursor = await _sql.tuples(conn).execute(_PARK, params)
        return cursor.rowcount

    rows = await handle.store.execute(update, what="parking", run_id=handle.run_id)
    return bool(rows == 1)
