"""Cancel and prune on the Postgres store: what ``durably cancel`` and ``durably prune`` do.

Both are short transactions on the runs table, so a kill at any instant leaves every
run whole or gone and every cancel either made or not:

- **cancel** locks the run's row. A run a live lease holds gets a request
  (``cancel_requested``), which its owner's next save returns; the engine then ends
  the run as ``cancelled`` after a save with no call in flight. A run nobody holds
  (queued, paused, parked, or its owner died) is saved as ``cancelled`` in the same
  transaction, with its token moved on, so no claim picks it and no stalled earlier
  owner's save lands after it.
- **prune** deletes finished runs old enough, a batch a statement, each with its
  changes. A run a live lease holds is never deleted (it is reported as owned), nor
  one another transaction has locked (a cancel or a claim under way): the next prune
  takes it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .. import faults
from ..checkpoint.envelope import seal
from ..errors import RunNotFound
from ..keys import validate_run_id
from ..state import Phase, RunState, UserMessage, utcnow
from ..stores import CancelOutcome, PruneReport
from . import _sql
from ._rows import Stored
from .schema import QUEUED

if TYPE_CHECKING:
    from psycopg import AsyncConnection

__all__ = ["PRUNE_BATCH", "cancel", "prune"]

_T = TypeVar("_T")

PRUNE_BATCH = 500
"""Runs one prune statement deletes: each batch is its own transaction, short enough
that claims and saves of other runs never wait long behind it."""


class _Store(Protocol):
    """What of :class:`~durably.postgres.PostgresStore` these use (it calls them)."""

    @property
    def where(self) -> str: ...

    async def execute(
        self,
        operation: Callable[[AsyncConnection[tuple[Any, ...]]], Awaitable[_T]],
        *,
        what: str,
        run_id: str = ...,
        writes: bool = ...,
    ) -> _T: ...

    def decode(self, run_id: str, stored: Stored) -> RunState: ...


async def cancel(store: _Store, run_id: str) -> CancelOutcome:
    """See :meth:`PostgresStore.cancel`."""
    validate_run_id(run_id)

    async def in_transaction(conn: AsyncConnection[tuple[Any, ...]]) -> CancelOutcome | None:
        async with conn.transaction():
            row = await _sql.fetchone(conn, _sql.CANCEL_LOCK, {"run_id": run_id})
            if row is None:
                return None
            phase, held, task, created_at = row
            if phase in (Phase.DONE, Phase.CANCELLED):
                return CancelOutcome.FINISHED
            if held:
                await _sql.tuples(conn).execute(_sql.CANCEL_ASK, {"run_id": run_id})
                return CancelOutcome.REQUESTED
            if phase == QUEUED:
                state = RunState(
                    run_id=run_id,
                    task=task,
                    created_at=created_at,
                    messages=[UserMessage(text=task)],
                )
                seq = 0
            else:
                # Read under the row's lock, in a statement of its own: it sees every
                # save that committed before the lock was taken, and none can land after.
                cursor = await _sql.tuples(conn).execute(_sql.READ, {"run_ids": [run_id]})
                found = await cursor.fetchone()
                if found is None:
                    return None
                stored = Stored.from_row(found[1:])
                state = store.decode(run_id, stored)
                seq = stored.seq
            state.cancel()
            state.saved_at = utcnow()
            await _sql.tuples(conn).execute(
                _sql.CANCEL_NOW,
                {
                    "run_id": run_id,
                    "seq": seq + 1,
                    "state": seal(state, journal=seq + 1),
                    "turns": state.turns,
                    "dollars": state.dollars,
                    "resumes": state.resumes,
                },
            )
            return CancelOutcome.CANCELLED

    outcome = await store.execute(in_transaction, what=f"cancelling run {run_id!r}", run_id=run_id)
    if outcome is None:
        raise RunNotFound(run_id=run_id, where=store.where)
    return outcome


async def prune(
    store: _Store,
    *,
    older_than: timedelta,
    now: datetime | None = None,
    batch: int = PRUNE_BATCH,
    progress: Callable[[int], None] | None = None,
) -> PruneReport:
    """See :meth:`PostgresStore.prune`; ``progress`` is called with the count pruned so far."""
    if older_than < timedelta(0):
        raise ValueError(f"older_than must not be negative, got {older_than}")
    params = {"older_than": older_than, "now": now, "batch": batch}

    async def delete(conn: AsyncConnection[tuple[Any, ...]]) -> list[str]:
        cursor = await _sql.tuples(conn).execute(_sql.PRUNE, params)
        return [str(row[0]) for row in await cursor.fetchall()]

    async def owned(conn: AsyncConnection[tuple[Any, ...]]) -> list[str]:
        cursor = await _sql.tuples(conn).execute(_sql.PRUNE_OWNED, params)
        return [str(row[0]) for row in await cursor.fetchall()]

    pruned: list[str] = []
    while True:
        # A batch is one statement in autocommit: deleted whole, or (killed) not at all.
        # Sent again after a broken connection it deletes what is still there.
        gone = await store.execute(delete, what="pruning finished runs")
        pruned += gone
        faults.point("postgres.prune.batch")
        if progress is not None:
            progress(len(pruned))
        if len(gone) < batch:
            break
    held = await store.execute(owned, what="listing finished runs still held", writes=False)
    return PruneReport(pruned=tuple(sorted(pruned)), owned=tuple(held))
