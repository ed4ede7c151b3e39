"""A Postgres store's connections: its pool, and how a statement is sent and retried.

The pool is opened, and the schema migrated, on a store's first statement. Every
statement durably sends is safe to repeat, so a broken connection is retried on
another, with stamina's backoff, until a deadline; a write that still fails is
``SaveFailed``, a read ``StoreUnavailable``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import SaveFailed, StorageError, StoreUnavailable
from .schema import migrate

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

    Pool = AsyncConnectionPool[AsyncConnection[tuple[Any, ...]]]

__all__ = ["OWN_POOL_SIZE", "Connections", "StoreStats", "is_transient"]

log = logging.getLogger("durably.store")
_T = TypeVar("_T")

_RETRY_FIRST = 0.02
_RETRY_MAX = 0.5
_POOL_PATIENCE = 1.0
"""Seconds a statement waits for the pool before it asks whether the pool is reconnecting."""

OWN_POOL_SIZE = 10
"""Connections in the pool a store opens for itself (one passed in has its own size)."""


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
    bypassed: int = 0
    """Statements sent on a connection of their own while the pool was still reconnecting."""


def is_transient(exc: BaseException) -> bool:
    """A connection-level failure: the server went away, is starting, or the pool is empty."""
    import psycopg

    return isinstance(exc, psycopg.OperationalError)


def _is_refused_privilege(exc: BaseException) -> bool:
    """The role may not do what was asked (SQLSTATE 42501: a read-only role writing)."""
    import psycopg

    return isinstance(exc, psycopg.errors.InsufficientPrivilege)


class Connections:
    """A store's connection pool and the sending of its statements on it.

    Args:
        dsn: the libpq connection string the store's own pool connects with.
        where: the database, for messages (``postgresql://host:port/db``).
        lease: how long a lease lasts: a statement is retried for up to one lease.
        stats: the store's counters (``retries`` is counted here).
        pool: a pool the caller opened and will close, or None for the store's own.
    """

    def __init__(
        self, dsn: str, *, where: str, lease: timedelta, stats: StoreStats, pool: Pool | None
    ) -> None:
        self.dsn = dsn
        self.where = where
        self.lease = lease
        self.stats = stats
        self.pool: Pool | None = pool
        self._owns_pool = pool is None
        self._migrated = False
        self._setup = asyncio.Lock()
        self._bypass = asyncio.Lock()
        self._pool_errors = 0

    @property
    def _kwargs(self) -> dict[str, Any]:
        """The keyword arguments every connection of the store's own pool is made with."""
        from psycopg.conninfo import conninfo_to_dict

        kwargs: dict[str, Any] = {"autocommit": True}
        if "application_name" not in conninfo_to_dict(self.dsn):
            kwargs["application_name"] = "durably"
        return kwargs

    @property
    def max_size(self) -> int:
        """The most connections the pool opens."""
        return self.pool.max_size if self.pool is not None else OWN_POOL_SIZE

    def describe(self, run_id: str) -> str:
        """Where the run lives: the database, the table and the row."""
        return f"{self.where} durably_runs[{run_id!r}]"

    async def close(self) -> None:
        """Close the store's own pool (a pool passed in is left open)."""
        if self.pool is not None and self._owns_pool:
            await self.pool.close()
            self.pool = None
            self._migrated = False

    async def connect(self) -> Pool:
        """The connection pool, opened and with the schema migrated on first use."""
        if self.pool is not None and self._migrated:
            return self.pool
        async with self._setup:
            if self.pool is None:
                from psycopg import AsyncConnection
                from psycopg_pool import AsyncConnectionPool

                pool: Pool = AsyncConnectionPool(
                    self.dsn,
                    connection_class=AsyncConnection,
                    kwargs=self._kwargs,
                    min_size=1,
                    max_size=OWN_POOL_SIZE,
                    # Give up a failing reconnection soon: the next request starts a new
                    # one at once, where psycopg_pool's backoff would wait minutes after a
                    # long outage before it tried again.
                    reconnect_timeout=max(5.0, self.lease.total_seconds()),
                    open=False,
                    name="durably",
                )
                await pool.open()
                self.pool = pool
            if not self._migrated:
                async with self.pool.connection(timeout=self.lease.total_seconds()) as conn:
                    await migrate(conn, where=self.where)
                self._migrated = True
            return self.pool

    async def run(
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
        checked as in :meth:`PostgresStore.create`), so a broken connection is retried on another
        until ``until`` (a ``time.monotonic`` deadline; default: one lease from now).
        A write that still fails is ``SaveFailed`` (the old state stays the truth);
        a read that still fails is ``StoreUnavailable``.
        """
        deadline = until if until is not None else time.monotonic() + self.lease.total_seconds()
        # The first try goes without stamina: setting up its retry context costs
        # more CPU than the statement itself (about 0.1 ms a call, which capped
        # saves/s at 32 runs), and nearly every statement succeeds at once.
        try:
            return await self.attempt(operation, deadline)
        except Exception as exc:
            if _is_refused_privilege(exc):
                raise self._refused(exc, what=what, run_id=run_id, writes=writes) from exc
            if not is_transient(exc):
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
        return StorageError(f"{self.where} ({what}): {detail}; nothing was changed; {remedy}")

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
            if not is_transient(exc) or time.monotonic() + delay >= deadline:
                return False
            self.stats.retries += 1
            log.info("%s: %s; trying again on another connection", what, exc)
            wait, delay = delay, min(_RETRY_MAX, delay * 2)
            return wait

        async def unreachable(exc: Exception) -> Exception:
            cause = await self.cause(exc)
            if writes and run_id != "-":
                return SaveFailed(
                    run_id=run_id,
                    path=self.describe(run_id),
                    reason=f"{what}: the database could not be reached ({cause}); check the "
                    "server and the network, not the disk",
                )
            # Not a run's save (a claim, the schema, a heartbeat): no run to name.
            outcome = "it may or may not have landed" if writes else "nothing was changed"
            return StoreUnavailable(where=f"{self.where} ({what})", reason=cause, outcome=outcome)

        # The first failure is judged and waited for as stamina would (no wait under
        # stamina.set_testing; no retry at all when stamina is inactive).
        wait = backoff(first) if stamina.is_active() else False
        if wait is False:
            raise await unreachable(first) from first
        if not stamina.is_testing():
            await asyncio.sleep(wait)
        try:
            async for attempt in stamina.retry_context(on=backoff, attempts=None, timeout=None):
                with attempt:
                    return await self.attempt(operation, deadline)
        except Exception as exc:
            if _is_refused_privilege(exc):
                raise self._refused(exc, what=what, run_id=run_id, writes=writes) from exc
            if not is_transient(exc):
                raise
            raise await unreachable(exc) from exc
        raise AssertionError("unreachable: stamina ends with a return or an exception")

    async def cause(self, exc: BaseException) -> str:
        """The real cause of a connection failure, for messages.

        The pool only says it timed out: then one direct connection is tried, and
        its error is the cause.
        """
        from psycopg_pool import PoolTimeout

        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if not isinstance(exc, PoolTimeout):
            return text
        from psycopg import AsyncConnection, OperationalError

        try:
            probe = await AsyncConnection.connect(self.dsn, connect_timeout=2, autocommit=True)
        except OperationalError as failed:
            detail = " ".join(str(failed).split()) or type(failed).__name__
            waited = text.replace("couldn't get a connection ", "")
            return f"{detail} (no connection of the pool {waited})"
        except Exception as failed:  # noqa: BLE001 - a diagnosis of an outage; any failure of the probe is its answer
            return f"{text}; connecting directly failed too: {type(failed).__name__}: {failed}"
        await probe.close()
        return f"{text}; the server accepts connections again now"

    async def attempt(
        self,
        operation: Callable[[AsyncConnection[tuple[Any, ...]]], Awaitable[_T]],
        deadline: float,
    ) -> _T:
        """One try of :meth:`run`'s operation on a pooled connection."""
        pool = self.pool if self._migrated and self.pool is not None else await self.connect()
        # getconn and putconn, not pool.connection(): its exit commits, which for
        # these autocommit statements does nothing but costs CPU on every save
        # (docs/design.md, "A save's own CPU"). putconn still discards or resets a
        # connection an error left broken or in a transaction.
        conn = await self._pooled(pool, deadline)
        if conn is None:
            return await self._bypassing(operation, deadline)
        try:
            return await self._send(conn, operation)
        finally:
            await pool.putconn(conn)

    async def _pooled(self, pool: Pool, deadline: float) -> AsyncConnection[Any] | None:
        """A connection of the pool; None when the pool is reconnecting but the server is up.

        After an outage psycopg_pool tries to reconnect 1, 2, 4, 8... seconds apart, so
        its next try may come up to twice the outage after the server went down, later
        than a lease. A statement waits for the pool a second at a time; when the pool
        has failed to connect since it last handed one over, the statement goes on a
        connection of its own (:meth:`_bypassing`) rather than wait for the backoff.
        Only the store's own pool is bypassed: a caller's pool may configure its
        connections (a role, a search path) in ways a bare connection would miss.
        """
        from psycopg_pool import PoolTimeout

        waited = False
        while True:
            remaining = deadline - time.monotonic()
            try:
                conn = await pool.getconn(timeout=max(0.05, min(remaining, _POOL_PATIENCE)))
            except PoolTimeout:
                if remaining <= _POOL_PATIENCE or not self._owns_pool:
                    raise
                waited = True
                if pool.get_stats().get("connections_errors", 0) != self._pool_errors:
                    return None
                continue
            if waited:
                self._pool_errors = pool.get_stats().get("connections_errors", 0)
            return conn

    async def _bypassing(
        self,
        operation: Callable[[AsyncConnection[tuple[Any, ...]]], Awaitable[_T]],
        deadline: float,
    ) -> _T:
        """The operation on a connection of its own, one such connection at a time."""
        from psycopg import AsyncConnection

        async with self._bypass:
            wait = max(1, min(5, int(deadline - time.monotonic())))
            conn = await AsyncConnection.connect(self.dsn, connect_timeout=wait, **self._kwargs)
            async with conn:
                self.stats.bypassed += 1
                return await self._send(conn, operation)

    @staticmethod
    async def _send(
        conn: AsyncConnection[Any],
        operation: Callable[[AsyncConnection[tuple[Any, ...]]], Awaitable[_T]],
    ) -> _T:
        if conn.autocommit:
            return await operation(conn)
        async with conn.transaction():
            return await operation(conn)
