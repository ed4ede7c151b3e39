"""The Postgres store: runs in a table, owned through leases with fencing tokens.

One row of ``durably_runs`` per run holds its state (the same checksummed
envelope the file store writes) and its lease: the owner, when the lease
expires, and a fencing token that grows by one on every acquisition. Every
expiry is decided by the database clock (``now() + interval``); this process's
clock is never compared with the database's.

- Opening takes the lease only if it is free or expired, in one ``UPDATE ...
  RETURNING``; otherwise ``Locked``.
- Every save is one ``UPDATE`` conditional on the token and an unexpired lease.
  Zero rows means another process took the run over (or the lease lapsed):
  ``LeaseLost``, and nothing was written. Because the lease lives in the same
  row as the state, a takeover waits for a save in flight and then reads it,
  and a save after a takeover finds the new token: the two are serialized by
  the row lock.
- While a handle is open an asyncio task renews the lease every
  ``renew_every``. A renewal that finds the lease gone, or that cannot reach the
  database before the lease would have run out, marks the handle lost, so the
  next save (the loop saves before every call that can act) raises ``LeaseLost``
  before any side effect.
- Closing cancels the renewal and frees the lease.

The schema is created and migrated by the library (:mod:`durably.postgres.schema`)
on a store's first statement. The work queue workers claim from is
:mod:`durably.postgres.queue`. ``docs/postgres.md`` describes the tables.

This module is the store and its handle; they hold the parts: ``_sql`` (every
statement), ``_rows`` (what a row holds, and the state it makes), ``_connection``
(the pool, and sending a statement with retries), ``_groupcommit`` (grouping the
saves that arrive while statements are in flight) and ``_lease`` (:class:`Lease`,
:func:`current_lease`, and the :class:`~._lease.LeaseKeeper` a handle renews its lease
through).

psycopg is imported when a store is made, never by ``import durably``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Self, TypeVar

from ..checkpoint.delta import Changes
from ..checkpoint.envelope import Sealer, seal
from ..errors import (
    Locked,
    RunExists,
    RunNotFound,
    SaveFailed,
)
from ..keys import validate_run_id
from ..state import RunState, utcnow
from . import _sql
from ._connection import Connections, StoreStats
from ._groupcommit import GroupCommit
from ._lease import (
    CURRENT_LEASE,
    Lease,
    LeaseKeeper,
    Renewals,
    current_lease,
    default_owner,
)
from ._rows import Stored, decoded
from ._sql import STORED, fetchone
from .schema import MIGRATIONS

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

    from ..listing import Listing
    from ..stores import CancelOutcome, PruneReport

    Pool = AsyncConnectionPool[AsyncConnection[tuple[Any, ...]]]

__all__ = [
    "STORED",
    "Lease",
    "PostgresRun",
    "PostgresStore",
    "StoreStats",
    "Stored",
    "current_lease",
]

log = logging.getLogger("durably.store")
_T = TypeVar("_T")

_SNAPSHOT_MIN_BYTES = 1 << 20
_SNAPSHOT_RATIO = 4.0
"""A save writes the whole state, and deletes the run's changes, once the changes since
the last snapshot hold more bytes than ``_SNAPSHOT_RATIO`` snapshots and than
``_SNAPSHOT_MIN_BYTES``; otherwise it writes its change. The journal store's
compaction policy (``compact_ratio``, ``compact_min_bytes``): a read replays at most
about five states' worth of bytes. Folding at one snapshot's worth above 64 KB wrote
a growing run's state about twice more into the WAL (a 60-turn run of 160 KB: 2.6x
the journal's bytes, 1.8x without; ``benchmarks/postgres.py``, docs/design.md)."""


def _summary(state: RunState) -> dict[str, Any]:
    """The summary columns a save writes (``durably runs`` reads them, not the state)."""
    return {"turns": state.turns, "dollars": state.dollars, "resumes": state.resumes}


class PostgresStore:
    """Runs in a PostgreSQL table, owned through leases with fencing tokens.

    Args:
        dsn: a libpq connection string or URL. Tables are created in the first
            schema of the connection's ``search_path``.
        owner: names this process in the lease (default: host, PID and a random tag).
        lease: how long a lease lasts without renewal. A process that stalls
            (GC pause, SIGSTOP, lost network) for longer loses its runs to others.
        renew_every: how often open handles renew their lease (default: a third
            of ``lease``).
        pool: a ``psycopg_pool.AsyncConnectionPool`` to use instead of the
            store's own; the caller opens and closes it. Any row factory will do
            (the store reads tuples on cursors of its own); autocommit is faster.
    """

    def __init__(
        self,
        dsn: str = "",
        *,
        owner: str | None = None,
        lease: timedelta = timedelta(seconds=15),
        renew_every: timedelta | None = None,
        pool: Pool | None = None,
    ) -> None:
        import psycopg.conninfo

        if lease <= timedelta(0):
            raise ValueError(f"lease must be positive, got {lease}")
        renew_every = renew_every if renew_every is not None else lease / 3
        if not timedelta(0) < renew_every < lease:
            raise ValueError(f"renew_every ({renew_every}) must be shorter than lease ({lease})")
        if pool is not None and isinstance(pool.conninfo, str):
            dsn = pool.conninfo
        self.dsn = dsn
        self.owner = owner or default_owner()
        self.lease = lease
        self.renew_every = renew_every
        self.stats = StoreStats()
        params = psycopg.conninfo.conninfo_to_dict(self.dsn)
        host = params.get("host") or params.get("hostaddr") or "localhost"
        port = f":{params['port']}" if params.get("port") else ""
        self._where = (
            f"postgresql://{host}{port}/{params.get('dbname') or params.get('user') or ''}"
        )
        self._connections = Connections(
            dsn, where=self._where, lease=lease, stats=self.stats, pool=pool
        )
        self._group = GroupCommit(self._connections)
        self._renewals = Renewals(self._connections)

    # -- the Store protocol ------------------------------------------------------------

    async def create(self, state: RunState) -> PostgresRun:
        """Claim a new run ID, save its first state, and own it (``RunExists`` if used before)."""
        run_id = validate_run_id(state.run_id)
        state.saved_at = utcnow()
        data = seal(state)
        params = {
            "run_id": run_id,
            "task": state.task,
            "phase": str(state.phase),
            "state": data,
            "owner": self.owner,
            "lease": self.lease,
            **_summary(state),
        }
        sent = time.monotonic()
        attempts = 0

        async def insert(conn: AsyncConnection[tuple[Any, ...]]) -> int | None:
            nonlocal attempts
            attempts += 1
            row = await fetchone(conn, _sql.CREATE, params)
            if row is not None:
                return int(row[0])
            if attempts > 1:
                # An earlier attempt may have committed before its connection broke.
                mine = await fetchone(conn, _sql.CREATED_MINE, params)
                if mine is not None:
                    return int(mine[0])
            return None

        token = await self._connections.run(insert, what=f"creating run {run_id!r}", run_id=run_id)
        if token is None:
            raise RunExists(run_id=run_id)
        self.stats.acquisitions += 1
        handle = PostgresRun(self, run_id, token, deadline=sent + self.lease.total_seconds(), seq=0)
        handle._loaded(state, Stored(data, 0, 0, ()))  # noqa: SLF001 -- the store sets up the handle it has just made (same module)
        handle.activate()
        return handle

    async def open(self, run_id: str) -> tuple[PostgresRun, RunState]:
        """Take the run's lease and load its state.

        Raises:
            Locked: another process holds a live lease (whatever this process's clock says).
            RunNotFound: no such run, or a submitted run no worker has started yet.
            CheckpointCorrupt: the stored state is not a valid checkpoint (left untouched).
        """
        validate_run_id(run_id)
        sent = time.monotonic()
        params = {"run_id": run_id, "owner": self.owner, "lease": self.lease}

        async def acquire(
            conn: AsyncConnection[tuple[Any, ...]],
        ) -> tuple[Any, ...] | None:
            row = await fetchone(conn, _sql.ACQUIRE, params)
            if row is not None:
                return row
            why = await fetchone(conn, _sql.WHY_NOT, params)
            if why is None:
                raise RunNotFound(run_id=run_id, where=self._where)
            queued, owner, expires_at, live = why
            if queued:
                raise RunNotFound(
                    run_id=run_id,
                    where=f"{self._where} (it is queued: submitted, not yet started by a worker)",
                )
            if live:
                raise Locked(
                    run_id=run_id,
                    path=f"{self.describe(run_id)}: lease held by {owner} until "
                    f"{expires_at.isoformat(timespec='seconds')}, database time",
                    lease=True,
                )
            return None  # the lease expired between the two statements: try again

        while (row := await self._connections.run(acquire, what=f"opening run {run_id!r}")) is None:
            sent = time.monotonic()
        self.stats.acquisitions += 1
        handle = PostgresRun(self, run_id, int(row[0]), deadline=sent + self.lease.total_seconds())
        try:
            stored = (await self.stored([run_id])).get(run_id)
            if stored is None:  # the row went (deleted by hand) between the two statements
                raise RunNotFound(run_id=run_id, where=self._where)
            state = decoded(run_id, stored, path=self.describe(run_id))
        except BaseException:
            await handle.close()
            raise
        handle._loaded(state, stored)  # noqa: SLF001 -- the store sets up the handle it has just made (same module)
        handle.activate()
        return handle, state

    async def read(self, run_id: str) -> RunState:
        """Load a run's state without taking its lease."""
        validate_run_id(run_id)

        async def select(conn: AsyncConnection[tuple[Any, ...]]) -> tuple[Any, ...] | None:
            return await fetchone(conn, _sql.READ, {"run_ids": [run_id]})

        row = await self._connections.run(select, what=f"reading run {run_id!r}", writes=False)
        if row is None:
            raise RunNotFound(run_id=run_id, where=self._where)
        if row[1] is None:
            raise RunNotFound(
                run_id=run_id,
                where=f"{self._where} (it is queued: submitted, not yet started by a worker)",
            )
        return decoded(run_id, Stored.from_row(row[1:]), path=self.describe(run_id))

    async def list_runs(self) -> list[str]:
        """The IDs of every started run, sorted (queued runs have no state yet)."""

        async def select(conn: AsyncConnection[tuple[Any, ...]]) -> list[str]:
            cursor = await _sql.tuples(conn).execute(_sql.LIST)
            return [str(row[0]) for row in await cursor.fetchall()]

        return sorted(await self._connections.run(select, what="listing runs", writes=False))

    def describe(self, run_id: str) -> str:
        """Where the run lives: the database, the table and the row."""
        return self._connections.describe(run_id)

    async def summaries(self) -> Listing:
        """Every run's summary (queued ones too) from the summary columns, not the states."""
        from .fleet import list_summaries

        return await list_summaries(self)

    async def cancel(self, run_id: str) -> CancelOutcome:
        """Stop ``run_id`` (see :class:`~durably.stores.Housekeeping`).

        At once when no live lease holds it (a queued run too: no worker will claim
        it), else after its owner's current save. Raises ``RunNotFound`` when there is
        no such run.
        """
        from .housekeeping import cancel

        return await cancel(self, run_id)

    async def prune(self, *, older_than: timedelta, now: datetime | None = None) -> PruneReport:
        """Delete finished runs last saved ``older_than`` before ``now``, with their changes.

        ``now`` None: the database clock. Never a run a live lease holds; a few
        hundred runs a transaction (see :class:`~durably.stores.Housekeeping`).
        """
        from .housekeeping import prune

        return await prune(self, older_than=older_than, now=now)

    @property
    def where(self) -> str:
        """The database, for messages: ``postgresql://host:port/dbname``, no password."""
        return self._where

    # -- for the work queue (durably.postgres.queue) ----------------------------------------

    async def execute(
        self,
        operation: Callable[[AsyncConnection[tuple[Any, ...]]], Awaitable[_T]],
        *,
        what: str,
        run_id: str = "-",
        writes: bool = True,
    ) -> _T:
        """Run ``operation(conn)`` on a pooled connection, as the store's own statements run.

        Connection failures are retried on another connection for up to one lease;
        ``operation`` must be safe to repeat.

        Args:
            operation: sends the statements, given a connection (autocommit).
            what: what it does, for messages (``"claiming runs"``).
            run_id: the run it concerns, for messages.
            writes: whether it changes the database: a failure is then ``SaveFailed``
                (it may or may not have landed), else ``StoreUnavailable``.
        """
        return await self._connections.run(operation, what=what, run_id=run_id, writes=writes)

    async def stored(self, run_ids: Sequence[str]) -> dict[str, Stored]:
        """What the rows of ``run_ids`` hold of their states, read in one statement.

        Runs that do not exist or are queued (no state yet) are left out. For a
        caller that took the runs' leases (a worker's claim): read after that, the
        rows hold every save an earlier owner made.
        """

        async def select(conn: AsyncConnection[tuple[Any, ...]]) -> dict[str, Stored]:
            cursor = await _sql.tuples(conn).execute(_sql.READ, {"run_ids": list(run_ids)})
            rows = await cursor.fetchall()
            return {str(row[0]): Stored.from_row(row[1:]) for row in rows if row[1] is not None}

        return await self._connections.run(select, what="reading runs", writes=False)

    def decode(self, run_id: str, stored: Stored) -> RunState:
        """The state a row holds; ``CheckpointCorrupt`` naming the row if it is not valid."""
        return decoded(run_id, stored, path=self.describe(run_id))

    def adopt(self, run_id: str, token: int, *, sent: float, seq: int = 0) -> PostgresRun:
        """A handle for a lease a statement of the caller's took (a worker's claim).

        The handle's first save writes the whole state (it has not seen what the row
        holds), and changes after that.

        Args:
            run_id: the run whose lease was taken.
            token: the fencing token the statement set.
            sent: ``time.monotonic()`` when the statement was sent: the lease surely
                ends one lease after it.
            seq: the row's ``seq``, as read after the lease was taken (0 for a
                queued run).
        """
        self.stats.acquisitions += 1
        return PostgresRun(self, run_id, token, deadline=sent + self.lease.total_seconds(), seq=seq)

    # -- lifecycle -----------------------------------------------------------------------

    async def migrate(self) -> int:
        """Create or upgrade the schema if needed and return its version.

        Every store does this once before its first statement; calling it first
        only moves the work (and its errors) earlier. Safe from many processes at once.
        """

        async def nothing(conn: AsyncConnection[tuple[Any, ...]]) -> None:
            return None

        await self._connections.run(nothing, what="preparing the schema")
        return MIGRATIONS[-1].version

    async def close(self) -> None:
        """Close the store's own connection pool (a pool passed in is left open)."""
        await self._connections.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class PostgresRun:
    """Ownership of one run in a :class:`PostgresStore`: its lease, renewed until closed."""

    def __init__(
        self, store: PostgresStore, run_id: str, token: int, *, deadline: float, seq: int = 0
    ) -> None:
        self._store = store
        self._run_id = run_id
        self._closed = False
        self.lease = Lease(run_id=run_id, token=token, owner=store.owner)
        self.keeper = LeaseKeeper(
            store._connections,  # noqa: SLF001 -- the store makes its handles (same module)
            self.lease,
            every=store.renew_every,
            deadline=deadline,
            renewals=store._renewals,  # noqa: SLF001 -- as above
        )
        """The lease as this handle keeps it: deadline, renewal, and why it was lost."""
        self._sealer = Sealer()
        """Keeps the last snapshot's encoded messages: the next encodes only the new ones."""
        self._seq = seq
        """The number of the last save the row holds."""
        self._changes: Changes | None = None
        """What the row holds, to make the next save's change; None: unknown, so the
        next save writes the whole state."""
        self._snapshot_bytes = 0
        self._change_bytes = 0
        """The changes' bytes since the snapshot: a snapshot is due when they outgrow it."""
        self._cancel_asked = False
        """Whether the last save's statement found a ``durably cancel`` request on the row."""

    @property
    def run_id(self) -> str:
        """The run this handle owns."""
        return self._run_id

    @property
    def store(self) -> PostgresStore:
        """The store this handle's lease is in."""
        return self._store

    def activate(self) -> None:
        """Make this handle's lease the :func:`current_lease` of the calling task."""
        CURRENT_LEASE.set(self.lease)

    @property
    def token(self) -> int:
        """The fencing token of this handle's lease."""
        return self.lease.token

    def cancel_requested(self) -> bool:
        """Whether ``durably cancel`` asked this run to stop, as the last save's row said.

        Costs nothing: every save's statement returns the request with its row.
        """
        return self._cancel_asked

    @property
    def lost(self) -> str | None:
        """Why the lease is known to be lost, or None while it may still be held."""
        return self.keeper.lost

    async def save(self, state: RunState) -> None:
        """Make ``state`` the run's state, in one statement conditional on this lease.

        The statement writes the change since the last save (``_sql.SAVE_CHANGE``),
        or the whole state when the history was rewritten, when the changes since
        the last snapshot have outgrown it, or at a claimed handle's first save.

        Raises:
            LeaseLost: another process took the run over, or the lease lapsed;
                nothing was written.
            SaveFailed: the database could not be reached before the lease ran out;
                the save may or may not have landed, and the run must stop.
        """
        store, keeper = self._store, self.keeper
        if self._closed:
            raise SaveFailed(
                run_id=self._run_id, path=store.describe(self._run_id), reason="closed"
            )
        keeper.check()
        if keeper.lost is not None:
            store.stats.stale_saves += 1
            raise await keeper.lost_error()
        state.saved_at = utcnow()
        seq = self._seq + 1
        changes = self._changes
        data = change = after = None
        if (
            changes is None
            or changes.rewritten(state)
            or self._change_bytes > max(_SNAPSHOT_MIN_BYTES, _SNAPSHOT_RATIO * self._snapshot_bytes)
        ):
            # The snapshot names its save number inside its checksum.
            data = self._sealer.seal(state, journal=seq)
        else:
            change, after = changes.record(state, seq, run=self._run_id)
        params = {
            "run_id": self._run_id,
            "token": self.lease.token,
            "seq": seq,
            "phase": str(state.phase),
            "state": data,
            "change": change,
            **_summary(state),
        }
        try:
            landed, self._cancel_asked = await store._group.save(params, keeper.deadline)  # noqa: SLF001 -- the run handle is part of its store (same module)
        except SaveFailed:
            keeper.mark_lost("a save could not reach the database before the lease ran out")
            raise
        if not landed:
            keeper.mark_lost("a save found the lease taken over or expired")
            store.stats.stale_saves += 1
            raise await keeper.lost_error()
        store.stats.saves += 1
        self._seq = seq
        if data is not None:
            store.stats.snapshots += 1
            self._loaded(state, Stored(data, seq, seq, ()))
        elif changes is not None and change is not None and after is not None:
            changes.saved(after)
            self._change_bytes += len(change)

    def _loaded(self, state: RunState, stored: Stored) -> None:
        """Take ``state`` as what the row holds, as ``stored`` holds it."""
        self._seq = stored.seq
        if self._changes is None:
            self._changes = Changes()
        self._changes.remember(state)
        self._snapshot_bytes = len(stored.state)
        self._change_bytes = sum(map(len, stored.changes))

    async def close(self, *, release: bool = True) -> None:
        """Stop renewing and free the lease (if it is still this handle's).

        With ``release=False`` the lease is left to run out by itself: nobody can
        claim the run before then (a worker's back-off after a failure).
        """
        if self._closed:
            return
        self._closed = True
        if CURRENT_LEASE.get() is self.lease:
            CURRENT_LEASE.set(None)
        await self.keeper.stop(release=release)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
