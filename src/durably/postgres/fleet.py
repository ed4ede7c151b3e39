"""What an operator sees of a Postgres fleet: every run's summary, queued runs, live workers.

:func:`list_summaries` reads the summary columns of ``durably_runs`` (phase, turns,
dollars, restarts, agent, owner, lease, parked) in one statement, never the states:
10,000 runs list in well under a second. Two kinds of rows are read whole: those saved
before schema version 4 (no summary columns yet, until their next save) and paused
runs, whose questions a person answers from the listing.

Workers record themselves in ``durably_workers`` (:func:`heartbeat`): the agents they
serve, and a heartbeat that keeps their row live for ``ttl``. :func:`live_workers`
lists the live ones, and :func:`queued_run` says of a queued run whether any serves
its agent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..errors import DurablyError
from ..listing import Listing, RunSummary, summarize
from . import _sql
from .schema import QUEUED

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    from ..state import RunState
    from ._rows import Stored

_T = TypeVar("_T")


class PostgresStore(Protocol):
    """What this module needs of a :class:`~durably.postgres.store.PostgresStore`.

    The store calls :func:`list_summaries`, so this module does not import it.
    """

    @property
    def owner(self) -> str: ...

    async def execute(
        self,
        operation: Callable[[AsyncConnection[tuple[Any, ...]]], Awaitable[_T]],
        *,
        what: str,
        run_id: str = "-",
        writes: bool = True,
    ) -> _T: ...

    async def stored(self, run_ids: Sequence[str]) -> dict[str, Stored]: ...

    def decode(self, run_id: str, stored: Stored) -> RunState: ...


__all__ = [
    "QueuedRun",
    "Worker",
    "heartbeat",
    "list_summaries",
    "live_workers",
    "queued_run",
    "retire",
]

_SUMMARIES = """
SELECT run_id, phase, turns, dollars, resumes, created_at, saved_at, agent, owner,
       extract(epoch FROM expires_at - now()), parked
FROM durably_runs
"""
"""Every run's summary columns; the lease as seconds left by the database clock
(negative: it expired that long ago; NULL: no lease, queued or handed back)."""

_WHOLE_BATCH = 200
"""Runs read whole per statement (the paused, and rows saved before version 4)."""


async def list_summaries(store: PostgresStore) -> Listing:
    """Every run of ``store`` (queued ones too), from the summary columns, by run ID."""

    async def select(conn: AsyncConnection[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        cursor = await _sql.tuples(conn).execute(_SUMMARIES)
        return await cursor.fetchall()

    rows = await store.execute(select, what="listing runs", writes=False)
    listing = Listing()
    whole: list[str] = []
    fleet: dict[str, dict[str, Any]] = {}
    for run_id, phase, turns, dollars, resumes, created, saved, agent, owner, left, parked in rows:
        fleet[run_id] = {
            "agent": agent,
            "owner": owner,
            "lease_left": float(left) if left is not None else None,
            "parked": parked,
        }
        if phase != QUEUED and (turns is None or phase == "paused"):
            whole.append(run_id)  # saved before version 4, or waiting with questions
            continue
        listing.summaries.append(
            RunSummary(
                run_id=run_id,
                phase=phase,
                turns=turns or 0,
                dollars=dollars or 0.0,
                resumes=resumes or 0,
                created_at=created,
                saved_at=saved,
                **fleet[run_id],
            )
        )
    for start in range(0, len(whole), _WHOLE_BATCH):
        batch = whole[start : start + _WHOLE_BATCH]
        stored = await store.stored(batch)
        for run_id in batch:
            if run_id not in stored:
                continue  # deleted since it was listed
            try:
                summary = summarize(store.decode(run_id, stored[run_id]))
            except DurablyError as exc:
                listing.unreadable.append((run_id, exc))
                continue
            listing.loaded += 1
            listing.summaries.append(_with(summary, fleet[run_id]))
    listing.summaries.sort(key=lambda s: s.run_id)
    listing.unreadable.sort(key=lambda u: u[0])
    return listing


def _with(summary: RunSummary, fields: dict[str, Any]) -> RunSummary:
    import msgspec

    return msgspec.structs.replace(summary, **fields)


@dataclass(frozen=True, kw_only=True)
class Worker:
    """A worker's row of ``durably_workers``."""

    owner: str
    """The name its leases carry (host, PID and a random tag)."""
    agents: tuple[str, ...]
    concurrency: int
    started_at: datetime
    seen_at: datetime
    """Its last heartbeat (database time)."""
    runs: int
    """Runs it holds a live lease of now."""


_HEARTBEAT = """
INSERT INTO durably_workers AS w (owner, agents, concurrency, expires_at)
VALUES (%(owner)s, %(agents)s, %(concurrency)s, now() + %(ttl)s)
ON CONFLICT (owner) DO UPDATE
SET agents = excluded.agents, concurrency = excluded.concurrency, seen_at = now(),
    expires_at = excluded.expires_at
"""

_FORGET_DEAD = "DELETE FROM durably_workers WHERE expires_at < now() - interval '1 day'"

_RETIRE = "DELETE FROM durably_workers WHERE owner = %(owner)s"

_LIVE = """
SELECT w.owner, w.agents, w.concurrency, w.started_at, w.seen_at,
       (SELECT count(*) FROM durably_runs AS r
        WHERE r.owner = w.owner AND r.expires_at > now())
FROM durably_workers AS w
WHERE w.expires_at > now() AND (%(agent)s::text IS NULL OR %(agent)s = ANY(w.agents))
ORDER BY w.started_at, w.owner
"""


async def heartbeat(
    store: PostgresStore, *, agents: Sequence[str], concurrency: int, ttl: timedelta
) -> None:
    """Record that this worker (``store.owner``) serves ``agents``, live for ``ttl`` more."""
    params = {
        "owner": store.owner,
        "agents": list(agents),
        "concurrency": concurrency,
        "ttl": ttl,
    }

    async def upsert(conn: AsyncConnection[tuple[Any, ...]]) -> None:
        await _sql.tuples(conn).execute(_HEARTBEAT, params)
        await _sql.tuples(conn).execute(_FORGET_DEAD)

    await store.execute(upsert, what="recording the worker's heartbeat")


async def retire(store: PostgresStore) -> None:
    """Remove this worker's row: it serves nothing any more."""

    async def delete(conn: AsyncConnection[tuple[Any, ...]]) -> None:
        await _sql.tuples(conn).execute(_RETIRE, {"owner": store.owner})

    await store.execute(delete, what="removing the worker's row")


async def live_workers(store: PostgresStore, *, agent: str | None = None) -> list[Worker]:
    """The workers whose heartbeat is live (serving ``agent``, if given), oldest first."""

    async def select(conn: AsyncConnection[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        cursor = await _sql.tuples(conn).execute(_LIVE, {"agent": agent})
        return await cursor.fetchall()

    rows = await store.execute(select, what="listing workers", writes=False)
    return [
        Worker(
            owner=owner,
            agents=tuple(agents),
            concurrency=int(concurrency),
            started_at=started,
            seen_at=seen,
            runs=int(runs),
        )
        for owner, agents, concurrency, started, seen, runs in rows
    ]


@dataclass(frozen=True, kw_only=True)
class QueuedRun:
    """A submitted run no worker has started yet, and the live workers that serve its agent."""

    run_id: str
    agent: str
    task: str
    created_at: datetime
    parked: str | None
    workers: list[Worker]


_QUEUED = """
SELECT agent, task, created_at, parked FROM durably_runs
WHERE run_id = %(run_id)s AND state IS NULL
"""


async def queued_run(store: PostgresStore, run_id: str) -> QueuedRun | None:
    """The queued run ``run_id``, or None if there is no such queued run."""

    async def select(conn: AsyncConnection[tuple[Any, ...]]) -> tuple[Any, ...] | None:
        cursor = await _sql.tuples(conn).execute(_QUEUED, {"run_id": run_id})
        return await cursor.fetchone()

    row = await store.execute(select, what=f"reading run {run_id!r}", writes=False)
    if row is None:
        return None
    agent, task, created, parked = row
    return QueuedRun(
        run_id=run_id,
        agent=agent,
        task=task,
        created_at=created,
        parked=parked,
        workers=await live_workers(store, agent=agent),
    )
