"""Receiver keys in PostgreSQL: shared by a service's machines, and transactional with its effect.

:class:`PostgresIdempotencyStore` keeps the same keys, with the same rules
(:func:`~durably.receivers._keys.judge`), as the SQLite
:class:`~durably.receivers.IdempotencyStore`, in one table of the service's own
database. It adds what a file cannot: an endpoint may declare its effect
*transactional* with the key (``IdempotencyMiddleware(..., transactional=True)``).
Its request then runs inside one database transaction, which the application
reaches through :func:`transaction`; the key's result is written and committed in
that same transaction, before the response leaves. That is Stripe's recovery
point: the effect and "done" commit together or not at all. A request whose
process dies mid-way rolls its effect back with it, so once its lease lapses a
retry with the key runs again (and the lookup answers ``rolled-back``, 404)
instead of waiting out the TTL.

psycopg (the ``durably[postgres]`` extra) is imported when the store opens.
"""

from __future__ import annotations

import asyncio
import contextvars
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from ..state import utcnow
from ._keys import (
    DEFAULT_LEASE,
    Abandoned,
    Busy,
    Claim,
    Claimed,
    KeyRecord,
    KeyRow,
    Stored,
    describe,
    encode_result,
    judge,
    owner_name,
)

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

__all__ = ["Effect", "PostgresIdempotencyStore", "transaction"]

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS durably_receiver_keys (
    principal text NOT NULL,
    key text NOT NULL,
    fingerprint text NOT NULL,
    token text NOT NULL,
    state text NOT NULL CHECK (state IN ('running', 'done')),
    started_at double precision NOT NULL,
    finished_at double precision,
    result bytea,
    owner text,
    lease_until double precision,
    transactional boolean NOT NULL DEFAULT false,
    PRIMARY KEY (principal, key)
);
CREATE INDEX IF NOT EXISTS durably_receiver_keys_payloads
    ON durably_receiver_keys (started_at) WHERE result IS NOT NULL;
"""
_SCHEMA_LOCK: Final = 0x6475726162  # "durab": concurrent first opens create the table once
_COLUMNS: Final = (
    "fingerprint, state, started_at, finished_at, result, owner, lease_until, transactional"
)

_current: contextvars.ContextVar[Effect] = contextvars.ContextVar("durably_receiver_effect")


def transaction() -> AsyncConnection[Any]:
    """The connection whose open transaction the current keyed request's effect belongs in.

    Write the effect through it and do not commit: the middleware commits it
    together with the key's result. Works inside a request the middleware runs
    with ``transactional=True``.

    Raises:
        LookupError: outside such a request (no key, another method, or an
            endpoint not declared transactional).
    """
    effect = _current.get(None)
    if effect is None:
        raise LookupError(
            "durably.receivers.postgres.transaction() was called outside a keyed request of "
            "an IdempotencyMiddleware(transactional=True) on a PostgresIdempotencyStore; "
            "requests without an Idempotency-Key have no key transaction: use your own"
        )
    return effect.connection


@dataclass(eq=False)
class Effect:
    """A transactional request's open transaction, committed with its key's result."""

    connection: AsyncConnection[Any]
    claim: Claimed
    store: PostgresIdempotencyStore
    finished: bool = field(default=False, init=False)

    async def finish(self, result: Stored) -> bool:
        """Mark the key done with ``result`` and commit it with the effect.

        False (and the effect rolled back) if the claim was taken over: this
        request stalled past its lease and a retry runs in its place.
        """
        cursor = await self.connection.execute(
            "UPDATE durably_receiver_keys SET state = 'done', finished_at = %s, result = %s"
            " WHERE principal = %s AND key = %s AND token = %s AND state = 'running'",
            (
                self.store.clock().timestamp(),
                encode_result(result),
                self.claim.principal,
                self.claim.key,
                self.claim.token,
            ),
        )
        self.finished = True
        if cursor.rowcount != 1:
            await self.connection.rollback()
            return False
        await self.connection.commit()
        return True


class PostgresIdempotencyStore:
    """A receiver's idempotency keys in PostgreSQL (table ``durably_receiver_keys``).

    Args:
        dsn: a libpq connection string; the table lands in the connection's
            ``search_path`` (created on first use).
        ttl: how long a key is remembered (default 24 hours, as Stripe).
        clock: the time source for key ages and leases (tests move it).
        lease: how long a running request holds its key without renewing it.
        max_connections: the pool's size; each transactional request in
            progress holds one.
    """

    def __init__(
        self,
        dsn: str,
        *,
        ttl: timedelta = timedelta(hours=24),
        clock: Callable[[], datetime] = utcnow,
        lease: timedelta = DEFAULT_LEASE,
        max_connections: int = 10,
    ) -> None:
        if ttl <= timedelta(0):
            raise ValueError(f"ttl must be positive, got {ttl}")
        if lease <= timedelta(0):
            raise ValueError(f"lease must be positive, got {lease}")
        if max_connections < 2:
            # A transactional request holds one connection while its lease renews on another.
            raise ValueError(f"max_connections must be at least 2, got {max_connections}")
        self.dsn = dsn
        self.ttl = ttl
        self.clock = clock
        self.lease = lease
        self.max_connections = max_connections
        self._pool: AsyncConnectionPool[Any] | None = None
        self._opening: asyncio.Lock | None = None

    async def close(self) -> None:
        """Close the pool; the store cannot be used afterwards."""
        if self._pool is not None:
            await self._pool.close()

    async def __aenter__(self) -> PostgresIdempotencyStore:
        await self._connections()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _connections(self) -> AsyncConnectionPool[Any]:
        """The pool, opened (and the table created) on first use."""
        if self._pool is not None:
            return self._pool
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._pool is None:
                from psycopg_pool import AsyncConnectionPool

                pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                    self.dsn, min_size=1, max_size=self.max_connections, open=False
                )
                await pool.open(wait=True)
                async with pool.connection() as conn:
                    await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                    await conn.execute(_SCHEMA)
                self._pool = pool
        return self._pool

    async def claim(
        self,
        key: str,
        fingerprint: str,
        *,
        principal: str = "",
        wait: float = 0.0,
        transactional: bool = False,
    ) -> Claim:
        """Take the key for a new request, or say why not (see ``IdempotencyStore.claim``).

        ``transactional``: this request's effect commits with its key (through
        :meth:`effect`); should its process die, a retry runs it again.
        """
        deadline = time.monotonic() + max(wait, 0.0)
        pause = 0.01
        while True:
            outcome = await self._claim(key, fingerprint, principal, transactional)
            if (
                not isinstance(outcome, Busy)
                or isinstance(outcome, Abandoned)
                or time.monotonic() >= deadline
            ):
                return outcome
            await asyncio.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
            pause = min(pause * 2, 0.1)

    async def _claim(
        self, key: str, fingerprint: str, principal: str, transactional: bool
    ) -> Claim:
        now = self.clock().timestamp()
        cutoff = now - self.ttl.total_seconds()
        token = secrets.token_hex(16)
        values = (
            fingerprint,
            token,
            now,
            owner_name(),
            now + self.lease.total_seconds(),
            transactional,
        )
        pool = await self._connections()
        async with pool.connection() as conn:  # one transaction, committed on leaving
            inserted = await conn.execute(
                "INSERT INTO durably_receiver_keys (principal, key, fingerprint, token, state,"
                " started_at, owner, lease_until, transactional)"
                " VALUES (%s, %s, %s, %s, 'running', %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                (principal, key, *values),
            )
            if inserted.rowcount == 1:
                return Claimed(key, token, principal)
            cursor = await conn.execute(
                f"SELECT {_COLUMNS} FROM durably_receiver_keys"  # noqa: S608 -- fixed names
                " WHERE principal = %s AND key = %s FOR UPDATE",
                (principal, key),
            )
            row = _row(key, await cursor.fetchone())
            outcome = judge(row, fingerprint, now=now, cutoff=cutoff) if row else None
            if outcome is not None:
                return outcome
            await conn.execute(
                "UPDATE durably_receiver_keys SET fingerprint = %s, token = %s,"
                " state = 'running', started_at = %s, finished_at = NULL, result = NULL,"
                " owner = %s, lease_until = %s, transactional = %s"
                " WHERE principal = %s AND key = %s",
                (*values, principal, key),
            )
            # Expired results are dead weight; their rows stay as tombstones.
            await conn.execute(
                "UPDATE durably_receiver_keys SET result = NULL"
                " WHERE result IS NOT NULL AND started_at <= %s",
                (cutoff,),
            )
        return Claimed(key, token, principal)

    async def finish(self, claim: Claimed, result: Stored) -> bool:
        """Store a claimed request's result; False if the claim was taken over."""
        pool = await self._connections()
        async with pool.connection() as conn:
            cursor = await conn.execute(
                "UPDATE durably_receiver_keys SET state = 'done', finished_at = %s, result = %s"
                " WHERE principal = %s AND key = %s AND token = %s AND state = 'running'",
                (
                    self.clock().timestamp(),
                    encode_result(result),
                    claim.principal,
                    claim.key,
                    claim.token,
                ),
            )
            return bool(cursor.rowcount == 1)

    async def renew(self, claim: Claimed) -> bool:
        """Extend a running request's lease; False if it finished or was taken over."""
        pool = await self._connections()
        async with pool.connection() as conn:
            cursor = await conn.execute(
                "UPDATE durably_receiver_keys SET lease_until = %s"
                " WHERE principal = %s AND key = %s AND token = %s AND state = 'running'",
                (
                    self.clock().timestamp() + self.lease.total_seconds(),
                    claim.principal,
                    claim.key,
                    claim.token,
                ),
            )
            return bool(cursor.rowcount == 1)

    async def record(self, key: str, *, principal: str = "") -> KeyRecord:
        """What the store knows about ``key`` under ``principal``."""
        now = self.clock().timestamp()
        pool = await self._connections()
        async with pool.connection() as conn:
            cursor = await conn.execute(
                f"SELECT {_COLUMNS} FROM durably_receiver_keys"  # noqa: S608 -- fixed names
                " WHERE principal = %s AND key = %s",
                (principal, key),
            )
            found = await cursor.fetchone()
        return describe(_row(key, found), key, now=now, cutoff=now - self.ttl.total_seconds())

    @asynccontextmanager
    async def effect(self, claim: Claimed) -> AsyncIterator[Effect]:
        """Open the transaction ``claim``'s effect runs in; :func:`transaction` returns it.

        Leaving without :meth:`Effect.finish` rolls the effect back.
        """
        pool = await self._connections()
        async with pool.connection() as conn:
            effect = Effect(connection=conn, claim=claim, store=self)
            reset = _current.set(effect)
            try:
                yield effect
            finally:
                _current.reset(reset)
                if not effect.finished:
                    await conn.rollback()


def _row(key: str, found: Any) -> KeyRow | None:
    if found is None:
        return None
    fingerprint, state, started, finished, result, owner, lease_until, transactional = found
    return KeyRow(
        key=key,
        fingerprint=fingerprint,
        state=state,
        started_at=started,
        finished_at=finished,
        result=bytes(result) if result is not None else None,
        owner=owner,
        lease_until=lease_until,
        transactional=transactional,
    )
