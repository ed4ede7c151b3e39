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

psycopg is imported when a store is made, never by ``import durably``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Self, TypeVar

from ..checkpoint.delta import Changes, apply, decode_record
from ..checkpoint.envelope import Sealer, open_sealed, seal
from ..errors import (
    CheckpointCorrupt,
    LeaseLost,
    Locked,
    RunExists,
    RunNotFound,
    SaveFailed,
    StorageError,
    StoreUnavailable,
)
from ..keys import validate_run_id
from ..state import RunState, check_ranges, utcnow
from .schema import MIGRATIONS, migrate

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

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

_RETRY_FIRST = 0.02
_RETRY_MAX = 0.5

_CREATE = """
INSERT INTO durably_runs (run_id, task, phase, state, saved_at, owner, token, expires_at)
VALUES (%(run_id)s, %(task)s, %(phase)s, %(state)s, now(), %(owner)s, 1, now() + %(lease)s)
ON CONFLICT (run_id) DO NOTHING
RETURNING token
"""

STORED = """r.state, r.state_seq, r.seq, ARRAY(
    SELECT c.change FROM durably_changes AS c
    WHERE c.run_id = r.run_id AND c.seq > r.state_seq ORDER BY c.seq)"""
"""What a row holds of its run's state (:class:`Stored`): the snapshot, its save number,
the last save's number, and the changes since the snapshot, in order. Only ever in a
``SELECT``, which reads the row and the changes from one snapshot of the database;
never in the ``RETURNING`` of an ``UPDATE``, which may wait for a save in flight and
then return that save's row with the changes of the older snapshot it began with."""

_ACQUIRE = """
UPDATE durably_runs
SET owner = %(owner)s, token = token + 1, expires_at = now() + %(lease)s
WHERE run_id = %(run_id)s AND state IS NOT NULL
  AND (expires_at IS NULL OR expires_at <= now())
RETURNING token
"""
"""Take a run's lease; its state is read after, by :data:`_READ`: once the token has
moved, no save of an earlier owner can land, and a statement begun after the
acquisition's commit sees every save that did."""

_WHY_NOT = """
SELECT state IS NULL, owner, expires_at, expires_at > now() FROM durably_runs
WHERE run_id = %(run_id)s
"""

_SAVE_CHANGE = """
WITH saved AS (
    UPDATE durably_runs
    SET phase = %(phase)s, saved_at = now(), parked = NULL, seq = %(seq)s
    WHERE run_id = %(run_id)s AND token = %(token)s AND expires_at > now()
      AND seq IN (%(seq)s - 1, %(seq)s)
    RETURNING run_id
), added AS (
    INSERT INTO durably_changes (run_id, seq, change)
    SELECT run_id, %(seq)s, %(change)s FROM saved
    ON CONFLICT (run_id, seq) DO NOTHING
)
SELECT run_id FROM saved
"""
"""One run's save as its change: the row's ``seq`` moves on and the change is a new row of
``durably_changes``, in one statement and one commit, conditional on the token and the
lease; the big snapshot is not written again. The row's ``seq`` must be the save
before this one, or this one: a save sent again after its first try landed unseen
(a broken connection) finds its change there and adds nothing."""

_SAVE_STATE = """
WITH saved AS (
    UPDATE durably_runs
    SET state = %(state)s, state_seq = %(seq)s, seq = %(seq)s, phase = %(phase)s,
        saved_at = now(), parked = NULL
    WHERE run_id = %(run_id)s AND token = %(token)s AND expires_at > now()
      AND seq IN (%(seq)s - 1, %(seq)s)
    RETURNING run_id
), dropped AS (
    DELETE FROM durably_changes AS c USING saved WHERE c.run_id = saved.run_id
)
SELECT run_id FROM saved
"""
"""One run's save as a new snapshot: the whole state, and the run's changes deleted, in
one statement conditional on the token, the lease and the save number as
:data:`_SAVE_CHANGE` is. Sent again after it landed unseen, it writes the same snapshot."""

_SAVE_MANY = """
WITH v AS (
    SELECT * FROM unnest(%(run_ids)b::text[], %(tokens)b::bigint[], %(seqs)b::bigint[],
                         %(phases)b::text[], %(states)b::bytea[], %(changes)b::bytea[])
        AS v(run_id, token, seq, phase, state, change)
), saved AS (
    UPDATE durably_runs AS r
    SET phase = v.phase, saved_at = now(), parked = NULL, seq = v.seq,
        state = CASE WHEN v.state IS NULL THEN r.state ELSE v.state END,
        state_seq = CASE WHEN v.state IS NULL THEN r.state_seq ELSE v.seq END
    FROM v
    WHERE r.run_id = v.run_id AND r.token = v.token AND r.expires_at > now()
      AND r.seq IN (v.seq - 1, v.seq)
    RETURNING r.run_id, v.seq, v.state IS NOT NULL AS whole, v.change
), dropped AS (
    DELETE FROM durably_changes AS c USING saved
    WHERE saved.whole AND c.run_id = saved.run_id
), added AS (
    INSERT INTO durably_changes (run_id, seq, change)
    SELECT run_id, seq, change FROM saved WHERE NOT saved.whole
    ON CONFLICT (run_id, seq) DO NOTHING
)
SELECT run_id FROM saved
"""
"""The saves of several runs in one statement and one commit, each row conditional on its
own token, lease and save number exactly as a lone save's is; the result names the rows
that landed. A save with a ``state`` is a snapshot, as :data:`_SAVE_STATE` writes one;
the others are changes, as :data:`_SAVE_CHANGE` writes one."""

_SAVES_IN_FLIGHT = 2
"""Save statements one store has in flight at once; saves arriving while that many are
wait, and go together in one statement when one ends (group commit). Two keep one
statement on the wire while the other commits. Caps of 2, 4 and 8 were measured
(``benchmarks/postgres.py``'s phases, three rounds, design.md): at 32 runs the rate
over the raw UPDATE's was 1.9-2.3x, 1.8-2.0x and 1.4-1.5x, at 8 runs 0.90-0.94x,
0.89-0.91x and 0.82-1.11x; bigger groups cost less client and server CPU per save."""

_SNAPSHOT_MIN_BYTES = 64 << 10
"""A save writes the whole state, and deletes the run's changes, once the changes since
the last snapshot hold more bytes than it and than this; otherwise it writes its change."""

_OWN_POOL_SIZE = 10
"""Connections in the pool a store opens for itself (one passed in has its own size)."""

_RENEW = """
UPDATE durably_runs SET expires_at = now() + %(lease)s
WHERE run_id = %(run_id)s AND token = %(token)s AND expires_at > now()
RETURNING token
"""

_RELEASE = """
UPDATE durably_runs SET expires_at = NULL
WHERE run_id = %(run_id)s AND token = %(token)s
"""

_READ = f"SELECT r.run_id, {STORED} FROM durably_runs AS r WHERE r.run_id = ANY(%(run_ids)s)"  # noqa: S608 -- built from this module's constants only
_LIST = "SELECT run_id FROM durably_runs WHERE state IS NOT NULL"


@dataclass(frozen=True, kw_only=True)
class Lease:
    """A run's lease as one handle holds it: whose, and under which fencing token."""

    run_id: str
    token: int
    owner: str


_current_lease: contextvars.ContextVar[Lease | None] = contextvars.ContextVar(
    "durably_current_lease", default=None
)


def current_lease() -> Lease | None:
    """The lease of the Postgres run the current task drives, or None.

    A tool whose service can check a fencing token (reject requests carrying a
    token lower than one it has seen for the run) sends ``current_lease().token``:
    that closes the one window leases cannot, a process that stalls between its
    attempt save and the request while another process takes the run over.
    """
    return _current_lease.get()


@dataclass(frozen=True, slots=True)
class Stored:
    """What a row holds of its run's state: a snapshot, and the changes saved since it."""

    state: bytes
    """The snapshot, in the checksummed envelope."""
    state_seq: int
    """The number of the save that wrote the snapshot."""
    seq: int
    """The number of the last save."""
    changes: tuple[bytes, ...]
    """The change records of saves ``state_seq + 1`` to ``seq``, in order."""

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Stored:
        """From the columns :data:`STORED` selects."""
        state, state_seq, seq, changes = row
        return cls(bytes(state), int(state_seq), int(seq), tuple(bytes(c) for c in changes))


@dataclass
class StoreStats:
    """Counters of one store, for workers' reports and tests."""

    acquisitions: int = 0
    """Leases taken: creates, opens and claims."""
    saves: int = 0
    """Saves the database accepted."""
    stale_saves: int = 0
    """Saves refused because the lease was lost: nothing was written."""
    renewals: int = 0
    lost: int = 0
    """Handles marked lost by a failed renewal."""
    retries: int = 0
    """Statements tried again after a connection error."""
    grouped: int = 0
    """Saves sent in one statement with other runs' saves (group commit), landed or fenced."""
    snapshots: int = 0
    """Saves the database accepted that wrote the whole state (the others wrote a change)."""


def _default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def _is_transient(exc: BaseException) -> bool:
    """A connection-level failure: the server went away, is starting, or the pool is empty."""
    import psycopg

    return isinstance(exc, psycopg.OperationalError)


def _is_refused_privilege(exc: BaseException) -> bool:
    """The role may not do what was asked (SQLSTATE 42501: a read-only role writing)."""
    import psycopg

    return isinstance(exc, psycopg.errors.InsufficientPrivilege)


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
            store's own; the caller opens and closes it.
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
        self.owner = owner or _default_owner()
        self.lease = lease
        self.renew_every = renew_every
        self.stats = StoreStats()
        self._pool: Pool | None = pool
        self._owns_pool = pool is None
        self._migrated = False
        self._setup = asyncio.Lock()
        self._saving = 0
        """Save statements in flight."""
        self._waiting: list[_Pending] = []
        """Saves waiting for the next group statement."""
        self._sending: set[str] = set()
        """Runs with a save statement in flight."""
        self._groups: set[asyncio.Task[None]] = set()
        params = psycopg.conninfo.conninfo_to_dict(self.dsn)
        host = params.get("host") or params.get("hostaddr") or "localhost"
        port = f":{params['port']}" if params.get("port") else ""
        self._where = (
            f"postgresql://{host}{port}/{params.get('dbname') or params.get('user') or ''}"
        )

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
        }
        sent = time.monotonic()
        attempts = 0

        async def insert(conn: AsyncConnection[tuple[Any, ...]]) -> int | None:
            nonlocal attempts
            attempts += 1
            row = await _fetchone(conn, _CREATE, params)
            if row is not None:
                return int(row[0])
            if attempts > 1:
                # An earlier attempt may have committed before its connection broke.
                mine = await _fetchone(
                    conn,
                    "SELECT token FROM durably_runs WHERE run_id = %(run_id)s "
                    "AND owner = %(owner)s AND state = %(state)s AND expires_at > now()",
                    params,
                )
                if mine is not None:
                    return int(mine[0])
            return None

        token = await self._run(insert, what=f"creating run {run_id!r}", run_id=run_id)
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
            row = await _fetchone(conn, _ACQUIRE, params)
            if row is not None:
                return row
            why = await _fetchone(conn, _WHY_NOT, params)
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

        while (row := await self._run(acquire, what=f"opening run {run_id!r}")) is None:
            sent = time.monotonic()
        self.stats.acquisitions += 1
        handle = PostgresRun(self, run_id, int(row[0]), deadline=sent + self.lease.total_seconds())
        try:
            stored = (await self.stored([run_id])).get(run_id)
            if stored is None:  # the row went (deleted by hand) between the two statements
                raise RunNotFound(run_id=run_id, where=self._where)
            state = self._decode(run_id, stored)
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
            return await _fetchone(conn, _READ, {"run_ids": [run_id]})

        row = await self._run(select, what=f"reading run {run_id!r}", writes=False)
        if row is None:
            raise RunNotFound(run_id=run_id, where=self._where)
        if row[1] is None:
            raise RunNotFound(
                run_id=run_id,
                where=f"{self._where} (it is queued: submitted, not yet started by a worker)",
            )
        return self._decode(run_id, Stored.from_row(row[1:]))

    async def list_runs(self) -> list[str]:
        """The IDs of every started run, sorted (queued runs have no state yet)."""

        async def select(conn: AsyncConnection[tuple[Any, ...]]) -> list[str]:
            cursor = await conn.execute(_LIST)
            return [str(row[0]) for row in await cursor.fetchall()]

        return sorted(await self._run(select, what="listing runs", writes=False))

    def describe(self, run_id: str) -> str:
        """Where the run lives: the database, the table and the row."""
        return f"{self._where} durably_runs[{run_id!r}]"

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
        return await self._run(operation, what=what, run_id=run_id, writes=writes)

    async def stored(self, run_ids: Sequence[str]) -> dict[str, Stored]:
        """What the rows of ``run_ids`` hold of their states, read in one statement.

        Runs that do not exist or are queued (no state yet) are left out. For a
        caller that took the runs' leases (a worker's claim): read after that, the
        rows hold every save an earlier owner made.
        """

        async def select(conn: AsyncConnection[tuple[Any, ...]]) -> dict[str, Stored]:
            cursor = await conn.execute(_READ, {"run_ids": list(run_ids)})
            rows = await cursor.fetchall()
            return {str(row[0]): Stored.from_row(row[1:]) for row in rows if row[1] is not None}

        return await self._run(select, what="reading runs", writes=False)

    def decode(self, run_id: str, stored: Stored) -> RunState:
        """The state a row holds; ``CheckpointCorrupt`` naming the row if it is not valid."""
        return self._decode(run_id, stored)

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

        await self._run(nothing, what="preparing the schema")
        return MIGRATIONS[-1].version

    async def close(self) -> None:
        """Close the store's own connection pool (a pool passed in is left open)."""
        if self._pool is not None and self._owns_pool:
            await self._pool.close()
            self._pool = None
            self._migrated = False

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- internals -----------------------------------------------------------------------

    def _decode(self, run_id: str, stored: Stored) -> RunState:
        path = self.describe(run_id)
        opened = open_sealed(stored.state, path=path)
        state = opened.state
        if state.run_id != run_id:
            raise CheckpointCorrupt(
                path=path, reason=f"it holds run {state.run_id!r}, not {run_id!r}"
            )
        if opened.journal != stored.state_seq:
            raise CheckpointCorrupt(
                path=path,
                reason=f"its state is the snapshot of save {opened.journal} and the row says "
                f"{stored.state_seq} (the state column was replaced or altered)",
            )
        seq = stored.state_seq
        for change in stored.changes:
            where = f"durably_changes[{run_id!r}, {seq + 1}]"
            record = decode_record(change, path=path, where=where)
            if (record.seq, record.run, record.gen) != (seq + 1, run_id, 0):
                raise CheckpointCorrupt(
                    path=path,
                    reason=f"{where} holds the change of save {record.seq} of run "
                    f"{record.run!r} (the rows were altered or moved)",
                )
            apply(state, record, path=path)
            seq = record.seq
        if seq < stored.seq:
            raise CheckpointCorrupt(
                path=path,
                reason=f"saves up to {stored.seq} were made and its changes end at save "
                f"{seq}: rows of durably_changes were deleted",
            )
        if seq > stored.seq:
            raise CheckpointCorrupt(
                path=path,
                reason=f"its changes go on to save {seq}, past the row's last save "
                f"{stored.seq}: the two tables come from different times (restored apart?)",
            )
        if stored.changes:
            check_ranges(state, path=path)
        return state

    async def _connect(self) -> Pool:
        """The connection pool, opened and with the schema migrated on first use."""
        if self._pool is not None and self._migrated:
            return self._pool
        async with self._setup:
            if self._pool is None:
                from psycopg import AsyncConnection
                from psycopg.conninfo import conninfo_to_dict
                from psycopg_pool import AsyncConnectionPool

                kwargs: dict[str, Any] = {"autocommit": True}
                if "application_name" not in conninfo_to_dict(self.dsn):
                    kwargs["application_name"] = "durably"
                pool: Pool = AsyncConnectionPool(
                    self.dsn,
                    connection_class=AsyncConnection,
                    kwargs=kwargs,
                    min_size=1,
                    max_size=_OWN_POOL_SIZE,
                    open=False,
                    name="durably",
                )
                await pool.open()
                self._pool = pool
            if not self._migrated:
                async with self._pool.connection(timeout=self.lease.total_seconds()) as conn:
                    await migrate(conn, where=self._where)
                self._migrated = True
            return self._pool

    async def _save(self, params: dict[str, Any], deadline: float) -> bool:
        """Send one run's save (see :meth:`PostgresRun.save`): True if it landed, False if fenced.

        Group commit: a save goes at once while fewer than ``_SAVES_IN_FLIGHT``
        save statements are in flight; otherwise it waits, and the saves waiting
        when a statement ends go together in one (:meth:`_send_group`). A group
        statement that fails as a whole (a broken connection, a deadlock) is not
        retried as a group: each of its saves is sent again alone, with the
        retries, deadline and errors of a lone save. That is safe because every
        row is conditional on its own token and lease: sending a save that did
        land again writes the same state.

        Args:
            params: the run's ``run_id``, ``token``, ``seq``, ``phase``, and either its
                sealed ``state`` (a snapshot) or its ``change`` record (the other None).
            deadline: ``time.monotonic()`` after which the lease may have run out.
        """
        run_id = params["run_id"]
        if self._saving >= self._in_flight_cap() or self._waiting or run_id in self._sending:
            pending = _Pending(params, deadline, asyncio.get_running_loop().create_future())
            self._waiting.append(pending)
            try:
                landed = await pending.outcome
            except asyncio.CancelledError:
                if _handed_back(pending):
                    # Cancelled as its group failed: the run's turn to send ends here.
                    self._sending.discard(run_id)
                    self._send_waiting()
                raise
            if landed is not None:
                return landed
            # The group failed: this run is still marked as sending (so a later save of
            # it waits), and this save goes again alone before anything else of the run.
        self._saving += 1
        self._sending.add(run_id)
        try:
            runs = await self._run(_saving([params]), what="saving", run_id=run_id, until=deadline)
            return run_id in runs
        finally:
            self._saving -= 1
            self._sending.discard(run_id)
            if self._waiting:
                self._send_waiting()

    def _send_waiting(self) -> None:
        """Send the waiting saves, as one statement per free place in flight.

        A run has one save in flight at a time: its next one waits for the statement
        to end, so two saves of one run land in the order they were made (and a
        statement never holds two rows of one run, of which one would land arbitrarily).
        """
        while self._waiting and self._saving < self._in_flight_cap():
            group: list[_Pending] = []
            later: list[_Pending] = []
            runs: set[str] = set()
            for pending in self._waiting:
                if pending.outcome.done():  # its caller was cancelled before it was sent
                    continue
                run_id = pending.params["run_id"]
                if run_id in runs or run_id in self._sending:
                    later.append(pending)
                else:
                    group.append(pending)
                    runs.add(run_id)
            self._waiting = later
            if not group:
                return  # what still waits goes when its run's statement ends
            # One order of rows in every group: two groups that share runs (a process
            # fenced off and the new owner) lock their rows in the same order.
            group.sort(key=lambda p: str(p.params["run_id"]))
            self._saving += 1
            self._sending |= runs
            task = asyncio.create_task(self._send_group(group), name="durably-save-group")
            self._groups.add(task)
            task.add_done_callback(self._groups.discard)

    async def _send_group(self, group: list[_Pending]) -> None:
        """One try of one statement for the group; each waiting save learns its own row's fate."""
        landed: set[str] | None = None
        try:
            landed = await self._attempt(
                _saving([p.params for p in group]), min(p.deadline for p in group)
            )
            if len(group) > 1:
                self.stats.grouped += len(group)
        except Exception as exc:
            log.log(
                logging.INFO if _is_transient(exc) else logging.WARNING,
                "saving %d runs in one statement failed (%s: %s); each is sent again alone",
                len(group),
                type(exc).__name__,
                exc,
            )
        finally:
            for pending in group:
                if not pending.outcome.done():
                    pending.outcome.set_result(
                        None if landed is None else pending.params["run_id"] in landed
                    )
                if not _handed_back(pending):
                    self._sending.discard(pending.params["run_id"])
                # else the run stays marked until its caller has sent the save alone
            self._saving -= 1
            if self._waiting:
                self._send_waiting()

    def _in_flight_cap(self) -> int:
        """How many save statements may be in flight at once.

        ``_SAVES_IN_FLIGHT``, fewer with a small pool: two connections stay free for
        renewals and reads.
        """
        size = self._pool.max_size if self._pool is not None else _OWN_POOL_SIZE
        return max(1, min(_SAVES_IN_FLIGHT, size - 2))

    async def _run(
        self,
        operation: Callable[[AsyncConnection[tuple[Any, ...]]], Awaitable[_T]],
        *,
        what: str,
        run_id: str = "-",
        until: float | None = None,
        writes: bool = True,
    ) -> _T:
        """Run ``operation(conn)`` on a pooled connection, retrying connection failures.

        Every statement durably sends is safe to repeat (conditional on the token, or
        checked as in :meth:`create`), so a broken connection is retried on another
        until ``until`` (a ``time.monotonic`` deadline; default: one lease from now).
        A write that still fails is ``SaveFailed`` (the old state stays the truth);
        a read that still fails is ``StoreUnavailable``.
        """
        deadline = until if until is not None else time.monotonic() + self.lease.total_seconds()
        # The first try goes without stamina: setting up its retry context costs
        # more CPU than the statement itself (about 0.1 ms a call, which capped
        # saves/s at 32 runs), and nearly every statement succeeds at once.
        try:
            return await self._attempt(operation, deadline)
        except Exception as exc:
            if _is_refused_privilege(exc):
                raise self._refused(exc, what=what, run_id=run_id, writes=writes) from exc
            if not _is_transient(exc):
                raise
            first = exc
        return await self._retry(
            operation, first, what=what, run_id=run_id, deadline=deadline, writes=writes
        )

    def _refused(self, exc: Exception, *, what: str, run_id: str, writes: bool) -> StorageError:
        """The error for a statement the role's privileges refused; nothing was changed."""
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        remedy = (
            "connect as a role that may write the durably tables (GRANT SELECT, INSERT, "
            "UPDATE, DELETE ON durably_runs and the other durably_ tables TO it)"
        )
        if writes and run_id != "-":
            return SaveFailed(
                run_id=run_id, path=self.describe(run_id), reason=f"{detail}; {remedy}"
            )
        return StorageError(f"{self._where} ({what}): {detail}; nothing was changed; {remedy}")

    async def _retry(
        self,
        operation: Callable[[AsyncConnection[tuple[Any, ...]]], Awaitable[_T]],
        first: Exception,
        *,
        what: str,
        run_id: str,
        deadline: float,
        writes: bool,
    ) -> _T:
        """After the first try failed with ``first``: wait and retry as stamina would."""
        import stamina

        delay = _RETRY_FIRST

        def backoff(exc: Exception) -> bool | float:
            # stamina's backoff hook: a float is the wait before the next try, False gives up.
            nonlocal delay
            if not _is_transient(exc) or time.monotonic() + delay >= deadline:
                return False
            self.stats.retries += 1
            log.info("%s: %s; trying again on another connection", what, exc)
            wait, delay = delay, min(_RETRY_MAX, delay * 2)
            return wait

        def unreachable(exc: Exception) -> Exception:
            if writes:
                return SaveFailed(
                    run_id=run_id,
                    path=self.describe(run_id) if run_id != "-" else self._where,
                    reason=f"{what}: the database could not be reached ({exc})",
                )
            return StoreUnavailable(where=f"{self._where} ({what})", reason=str(exc))

        # The first failure is judged and waited for as stamina would (no wait under
        # stamina.set_testing; no retry at all when stamina is inactive).
        wait = backoff(first) if stamina.is_active() else False
        if wait is False:
            raise unreachable(first) from first
        if not stamina.is_testing():
            await asyncio.sleep(wait)
        try:
            async for attempt in stamina.retry_context(on=backoff, attempts=None, timeout=None):
                with attempt:
                    return await self._attempt(operation, deadline)
        except Exception as exc:
            if _is_refused_privilege(exc):
                raise self._refused(exc, what=what, run_id=run_id, writes=writes) from exc
            if not _is_transient(exc):
                raise
            raise unreachable(exc) from exc
        raise AssertionError("unreachable: stamina ends with a return or an exception")

    async def _attempt(
        self,
        operation: Callable[[AsyncConnection[tuple[Any, ...]]], Awaitable[_T]],
        deadline: float,
    ) -> _T:
        """One try of :meth:`_run`'s operation on a pooled connection."""
        pool = self._pool if self._migrated and self._pool is not None else await self._connect()
        timeout = max(0.05, deadline - time.monotonic())
        async with pool.connection(timeout=timeout) as conn:
            if conn.autocommit:
                return await operation(conn)
            async with conn.transaction():
                return await operation(conn)


@dataclass(slots=True)
class _Pending:
    """A save waiting for a group statement."""

    params: dict[str, Any]
    deadline: float
    outcome: asyncio.Future[bool | None]
    """True: it landed; False: fenced (nothing written); None: send it again alone."""


def _handed_back(pending: _Pending) -> bool:
    """Whether a failed group gave this save back to its caller to send alone."""
    outcome = pending.outcome
    return outcome.done() and not outcome.cancelled() and outcome.result() is None


def _saving(
    saves: list[dict[str, Any]],
) -> Callable[[AsyncConnection[tuple[Any, ...]]], Awaitable[set[str]]]:
    """The statement that sends ``saves`` (of distinct runs): it returns the runs that landed.

    One save goes as :data:`_SAVE_CHANGE` or :data:`_SAVE_STATE`; several as
    :data:`_SAVE_MANY`.
    """
    if len(saves) == 1:
        params = saves[0]
        statement = _SAVE_STATE if params["change"] is None else _SAVE_CHANGE

        async def one(conn: AsyncConnection[tuple[Any, ...]]) -> set[str]:
            cursor = await conn.execute(statement, params)
            return {str(row[0]) for row in await cursor.fetchall()}

        return one
    columns = {
        "run_ids": [p["run_id"] for p in saves],
        "tokens": [p["token"] for p in saves],
        "seqs": [p["seq"] for p in saves],
        "phases": [p["phase"] for p in saves],
        "states": [p["state"] for p in saves],
        "changes": [p["change"] for p in saves],
    }

    async def many(conn: AsyncConnection[tuple[Any, ...]]) -> set[str]:
        cursor = await conn.execute(_SAVE_MANY, columns)
        return {str(row[0]) for row in await cursor.fetchall()}

    return many


async def _fetchone(
    conn: AsyncConnection[tuple[Any, ...]], sql: str, params: dict[str, Any]
) -> tuple[Any, ...] | None:
    cursor = await conn.execute(sql, params)
    return await cursor.fetchone()


class PostgresRun:
    """Ownership of one run in a :class:`PostgresStore`: its lease, renewed until closed."""

    def __init__(
        self, store: PostgresStore, run_id: str, token: int, *, deadline: float, seq: int = 0
    ) -> None:
        self._store = store
        self._run_id = run_id
        self._token = token
        self._deadline = deadline
        """``time.monotonic()`` by which the lease has surely run out without a renewal:
        the send time of the last statement that set it, plus the lease."""
        self._lost: str | None = None
        self._closed = False
        self.lease = Lease(run_id=run_id, token=token, owner=store.owner)
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
        self._renewal = asyncio.create_task(self._renew_forever(), name=f"durably-renew-{run_id}")

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
        _current_lease.set(self.lease)

    @property
    def token(self) -> int:
        """The fencing token of this handle's lease."""
        return self._token

    @property
    def lost(self) -> str | None:
        """Why the lease is known to be lost, or None while it may still be held."""
        return self._lost

    async def save(self, state: RunState) -> None:
        """Make ``state`` the run's state, in one statement conditional on this lease.

        The statement writes the change since the last save (:data:`_SAVE_CHANGE`),
        or the whole state when the history was rewritten, when the changes since
        the last snapshot have outgrown it, or at a claimed handle's first save.

        Raises:
            LeaseLost: another process took the run over, or the lease lapsed;
                nothing was written.
            SaveFailed: the database could not be reached before the lease ran out;
                the save may or may not have landed, and the run must stop.
        """
        store = self._store
        if self._closed:
            raise SaveFailed(
                run_id=self._run_id, path=store.describe(self._run_id), reason="closed"
            )
        if self._lost is None and time.monotonic() >= self._deadline:
            self._mark_lost("no renewal reached the database before the lease ran out")
        if self._lost is not None:
            store.stats.stale_saves += 1
            raise LeaseLost(run_id=self._run_id, token=self._token)
        state.saved_at = utcnow()
        seq = self._seq + 1
        changes = self._changes
        data = change = after = None
        if (
            changes is None
            or changes.rewritten(state)
            or self._change_bytes > max(_SNAPSHOT_MIN_BYTES, self._snapshot_bytes)
        ):
            # The snapshot names its save number inside its checksum.
            data = self._sealer.seal(state, journal=seq)
        else:
            change, after = changes.record(state, seq, run=self._run_id)
        params = {
            "run_id": self._run_id,
            "token": self._token,
            "seq": seq,
            "phase": str(state.phase),
            "state": data,
            "change": change,
        }
        try:
            landed = await store._save(params, self._deadline)  # noqa: SLF001 -- the run handle is part of its store (same module)
        except SaveFailed:
            self._mark_lost("a save could not reach the database before the lease ran out")
            raise
        if not landed:
            self._mark_lost("a save found the lease taken over or expired")
            store.stats.stale_saves += 1
            raise LeaseLost(run_id=self._run_id, token=self._token)
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
        self._renewal.cancel()
        # asyncio.wait, not await: the renewal's CancelledError is its own, while a
        # cancellation of this close() must still propagate.
        await asyncio.wait([self._renewal])
        if _current_lease.get() is self.lease:
            _current_lease.set(None)
        if self._lost is not None or not release:
            return
        params = {"run_id": self._run_id, "token": self._token}

        async def update(conn: AsyncConnection[tuple[Any, ...]]) -> None:
            await conn.execute(_RELEASE, params)

        try:
            await self._store._run(  # noqa: SLF001 -- the run handle is part of its store (same module)
                update,
                what="releasing the lease",
                run_id=self._run_id,
                until=min(self._deadline, time.monotonic() + 2.0),
            )
        except SaveFailed as exc:
            # Nothing depends on it: the lease runs out on its own.
            log.warning(
                "run %s: could not free its lease (%s); it expires by itself", self._run_id, exc
            )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _mark_lost(self, why: str) -> None:
        if self._lost is None:
            self._lost = why
            self._store.stats.lost += 1
            log.warning("run %s: lease (token %d) lost: %s", self._run_id, self._token, why)
            if not self._renewal.done() and self._renewal is not asyncio.current_task():
                self._renewal.cancel()

    async def _renew_forever(self) -> None:
        store = self._store
        every = store.renew_every.total_seconds()
        lease = store.lease.total_seconds()
        params = {"run_id": self._run_id, "token": self._token, "lease": store.lease}

        async def update(conn: AsyncConnection[tuple[Any, ...]]) -> bool:
            return await _fetchone(conn, _RENEW, params) is not None

        while self._lost is None:
            await asyncio.sleep(every)
            sent = time.monotonic()
            if sent >= self._deadline:
                self._mark_lost("the lease ran out before it could be renewed")
                return
            try:
                # One attempt per period, bounded by the lease: a renewal that
                # lands after the lease ran out changes nothing (it is conditional).
                renewed = await store._run(  # noqa: SLF001 -- the run handle is part of its store (same module)
                    update,
                    what="renewing the lease",
                    run_id=self._run_id,
                    until=min(self._deadline, sent + every),
                )
            except SaveFailed as exc:
                log.info("run %s: renewal failed (%s); trying again", self._run_id, exc)
                continue
            except Exception as exc:  # not a connection problem: the lease cannot be trusted
                self._mark_lost(f"renewing failed: {type(exc).__name__}: {exc}")
                return
            if not renewed:
                self._mark_lost("the lease was taken over or expired")
                return
            self._deadline = sent + lease
            store.stats.renewals += 1
