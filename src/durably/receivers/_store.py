"""Where a receiver keeps its idempotency keys: one SQLite file, durable on every commit.

A key goes through two states. ``claim`` inserts it as *running* with a
fingerprint of the request (method, path and body, or tool and arguments), a
random claim token, its owner (host and process) and a lease; ``finish`` stores
the result the request produced and marks it *done*. Both are single
transactions (``BEGIN IMMEDIATE``), so two workers sharing the file never both
run the same key. The database runs in WAL mode with ``synchronous=FULL``: a
finished key survives a crash or power cut of the service.

A running request renews its lease (:func:`renewing`) until it finishes. A key
whose lease lapsed belongs to a request that died with its process: it is
settled, not left in flight for the TTL. The effect of a request on this store
is never in the keys' transaction, so whether it acted is unknown: a retry is
answered :class:`Abandoned` and a lookup ``abandoned`` (a person decides). A
key store that shares a transaction with the effect
(:class:`~durably.receivers.postgres.PostgresIdempotencyStore`) runs the retry
instead. A running row written before leases (format 2, no lease) is in flight
until its TTL, as it always was: nothing says its process died.

Keys are scoped by principal, as Stripe scopes them by account: a receiver
stores a client's key with a digest of who sent it (its credentials, or the
identity the service names) in a column of its own, so the same key from
another principal, or from no principal, is another key, never a replay of
someone else's result, whatever the key's characters (format 1 joined the two
as ``<digest>/<key>``, which an anonymous key could spell; such a file is
migrated on first open).

A key older than the TTL counts as no key: a new request with it runs again.
Its row is kept as a tombstone (its result dropped), so a lookup can tell "I
forgot" from "I never saw it"; only the second may be answered "not found".

All SQLite calls run in a worker thread (``asyncio.to_thread``) under one lock.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import random
import secrets
import sqlite3
import stat
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final, TypeVar

from ..errors import UnsafePath
from ..state import utcnow
from ..stores._guard import check_trusted, describe_kind
from ._keys import (
    DEFAULT_LEASE,
    MAX_KEY_LENGTH,
    Abandoned,
    Busy,
    Claim,
    Claimed,
    KeyRecord,
    KeyRow,
    KeyState,
    KeyStore,
    Mismatch,
    Replay,
    Stored,
    StoredOutcome,
    StoredResponse,
    Unstored,
    describe,
    encode_result,
    judge,
    owner_name,
    principal_digest,
    renewing,
    valid_key,
)

# The shared records and rules are re-exported: this module was their home before
# the Postgres key store arrived, and callers import them from here.
__all__ = [
    "FORMAT",
    "MAX_KEY_LENGTH",
    "Abandoned",
    "Busy",
    "Claim",
    "Claimed",
    "IdempotencyStore",
    "KeyRecord",
    "KeyState",
    "KeyStore",
    "KeyTable",
    "Mismatch",
    "Replay",
    "Stored",
    "StoredOutcome",
    "StoredResponse",
    "Unstored",
    "principal_digest",
    "renewing",
    "valid_key",
]

log = logging.getLogger("durably.receivers")

_T = TypeVar("_T")

_TABLE: Final = """
CREATE TABLE IF NOT EXISTS {name} (
    principal TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    token TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('running', 'done')),
    started_at REAL NOT NULL,
    finished_at REAL,
    result BLOB,
    owner TEXT,
    lease_until REAL,
    PRIMARY KEY (principal, key)
) WITHOUT ROWID
"""
_INDEX: Final = """
CREATE INDEX IF NOT EXISTS durably_idempotency_payloads
    ON durably_idempotency (started_at) WHERE result IS NOT NULL
"""
# Format 1 kept one ``key`` column: ``<32 hex digits>/<key>`` for a principal's key, the
# bare key for none. Its rows move to the principal column; a bare key shaped like a
# scoped one is read as scoped (as format 1 itself found it for that principal).
_MIGRATE_V1: Final = """
INSERT INTO durably_idempotency_v2
    (principal, key, fingerprint, token, state, started_at, finished_at, result)
SELECT
    CASE WHEN scoped THEN substr(key, 1, 32) ELSE '' END,
    CASE WHEN scoped THEN substr(key, 34) ELSE key END,
    fingerprint, token, state, started_at, finished_at, result
FROM (
    SELECT *, (length(key) > 33 AND substr(key, 33, 1) = '/'
               AND substr(key, 1, 32) NOT GLOB '*[^0-9a-f]*') AS scoped
    FROM durably_idempotency
)
"""


FORMAT: Final = 3
"""The database layout's version, kept in SQLite's ``user_version`` (3: owner and lease)."""


class IdempotencyStore:
    """A receiver's idempotency keys and the results they produced, in one SQLite file.

    Args:
        path: the database file (created if missing; its directory must exist).
        ttl: how long a key is remembered; tell agents a slightly shorter
            ``key_ttl``. Default 24 hours, as Stripe.
        clock: the time source for key ages and leases (tests move it).
        lease: how long a running request holds its key without renewing it
            (it renews every third of that): a request whose process died is
            settled this long after its last renewal.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        ttl: timedelta = timedelta(hours=24),
        clock: Callable[[], datetime] = utcnow,
        lease: timedelta = DEFAULT_LEASE,
    ) -> None:
        if ttl <= timedelta(0):
            raise ValueError(f"ttl must be positive, got {ttl}")
        if lease <= timedelta(0):
            raise ValueError(f"lease must be positive, got {lease}")
        self.path = Path(path)
        self.ttl = ttl
        self.lease = lease
        self.clock = clock
        self._lock = threading.Lock()
        identity = _check_database(self.path)
        # One connection shared by worker threads, serialized by the lock;
        # autocommit mode so every transaction below is explicit.
        self._db = sqlite3.connect(
            self.path, timeout=_BUSY_TIMEOUT, isolation_level=None, check_same_thread=False
        )
        try:
            _same_file(self.path, identity)
            _retry_while_busy(self._set_up, path=self.path)
            _check_database(self.path)  # the side files SQLite just made or opened
        except BaseException:
            self._db.close()
            raise

    def _set_up(self) -> None:
        """Put a new or existing database in WAL mode with the current schema.

        Switching to WAL takes the database's exclusive lock without SQLite's busy
        handler, so several processes opening a fresh file at once see ``database
        is locked`` at once, whatever the timeout: the caller retries.
        """
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            (version,) = db.execute("PRAGMA user_version").fetchone()
            if version > FORMAT:
                raise RuntimeError(
                    f"{self.path} holds idempotency keys in format {version}; this durably "
                    f"reads format {FORMAT}: upgrade durably, or give the store a new file"
                )
            columns = {row[1] for row in db.execute("PRAGMA table_info(durably_idempotency)")}
            if columns and "principal" not in columns:  # format 1: migrate it in place
                db.execute(_TABLE.format(name="durably_idempotency_v2"))
                db.execute(_MIGRATE_V1)
                db.execute("DROP TABLE durably_idempotency")
                db.execute("ALTER TABLE durably_idempotency_v2 RENAME TO durably_idempotency")
                log.info("%s: idempotency keys moved from format %d to %d", self.path, 1, FORMAT)
            elif columns and "lease_until" not in columns:
                log.info("%s: idempotency keys moved from format %d to %d", self.path, 2, FORMAT)
            KeyTable(db).create()  # format 2's table gains owner and lease there
            db.execute(f"PRAGMA user_version = {FORMAT}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        """Close the database; the store cannot be used afterwards."""
        with self._lock:
            self._db.close()

    async def claim(
        self,
        key: str,
        fingerprint: str,
        *,
        principal: str = "",
        wait: float = 0.0,
        transactional: bool = False,
    ) -> Claim:
        """Take the key for a new request, or say why not.

        ``principal`` is the sender's :func:`principal_digest` ("" for nobody in
        particular): the same key under another principal is another key.
        While another request holds the key, poll for up to ``wait`` seconds
        for it to finish, then answer :class:`Busy`; a holder whose lease
        lapsed is :class:`Abandoned` at once.

        Raises:
            ValueError: ``transactional``: a request's effect cannot share a
                transaction with this SQLite file.
        """
        if transactional:
            raise ValueError(
                f"{self.path}: an SQLite key file cannot share a transaction with the "
                "endpoint's effect; use PostgresIdempotencyStore for transactional endpoints"
            )
        deadline = time.monotonic() + max(wait, 0.0)
        pause = 0.01
        while True:
            outcome = await self._run(self._claim, key, fingerprint, principal)
            if (
                not isinstance(outcome, Busy)
                or isinstance(outcome, Abandoned)
                or time.monotonic() >= deadline
            ):
                return outcome
            await asyncio.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
            pause = min(pause * 2, 0.1)

    async def finish(self, claim: Claimed, result: Stored) -> bool:
        """Store a claimed request's result; False if the claim expired and was taken over."""
        return await self._run(self._finish, claim, encode_result(result))

    async def renew(self, claim: Claimed) -> bool:
        """Extend a running request's lease; False if it finished or was taken over."""
        return await self._run(self._renew, claim)

    async def record(self, key: str, *, principal: str = "") -> KeyRecord:
        """What the store knows about ``key`` under ``principal`` (see :meth:`claim`)."""
        return await self._run(self._record, key, principal)

    # -- blocking parts, run in a worker thread -------------------------------------------

    async def _run(self, function: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.to_thread(self._locked, function, *args)

    def _locked(self, function: Callable[..., _T], *args: Any) -> _T:
        with self._lock:
            return function(*args)

    def _keys(self) -> KeyTable:
        return KeyTable(self._db, ttl=self.ttl, clock=self.clock, lease=self.lease)

    def _claim(self, key: str, fingerprint: str, principal: str = "") -> Claim:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            outcome = self._keys().claim(key, fingerprint, principal=principal)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return outcome

    def _renew(self, claim: Claimed) -> bool:
        return self._keys().renew(claim)

    def _finish(self, claim: Claimed, result: bytes) -> bool:
        return self._keys().finish_encoded(claim, result)

    def _record(self, key: str, principal: str = "") -> KeyRecord:
        return self._keys().record(key, principal=principal)


class KeyTable:
    """The idempotency keys as a table in a SQLite database of the caller's own.

    :class:`IdempotencyStore` is this table in a file of its own. A service that
    keeps its records in SQLite can keep its keys beside them instead: each
    method runs its statements on the caller's connection and begins or commits
    nothing, so the caller claims the key, does the work and finishes the key in
    *one* transaction (``BEGIN IMMEDIATE``). A crash then leaves all three or
    none: never a key claimed with no result (which answers :class:`Busy` until
    the TTL ends) and never an effect whose key was not recorded. The demo's
    issue tracker (``durably.triage.tracker``) keeps its keys this way.

    Args:
        db: the connection; the table is ``durably_idempotency`` (see :meth:`create`).
        ttl: how long a key is remembered, as for :class:`IdempotencyStore`.
        clock: the time source for key ages.
    """

    def __init__(
        self,
        db: sqlite3.Connection,
        *,
        ttl: timedelta = timedelta(hours=24),
        clock: Callable[[], datetime] = utcnow,
        lease: timedelta = DEFAULT_LEASE,
    ) -> None:
        if ttl <= timedelta(0):
            raise ValueError(f"ttl must be positive, got {ttl}")
        if lease <= timedelta(0):
            raise ValueError(f"lease must be positive, got {lease}")
        self.db = db
        self.ttl = ttl
        self.clock = clock
        self.lease = lease

    def create(self) -> None:
        """Create the table and its index if the database has none (its version is the caller's).

        A table of format 2 (no owner or lease) gains the two columns; its running
        rows keep no lease and stay in flight until their TTL, as they were.
        """
        columns = {row[1] for row in self.db.execute("PRAGMA table_info(durably_idempotency)")}
        if columns and "lease_until" not in columns:
            self.db.execute("ALTER TABLE durably_idempotency ADD COLUMN owner TEXT")
            self.db.execute("ALTER TABLE durably_idempotency ADD COLUMN lease_until REAL")
        self.db.execute(_TABLE.format(name="durably_idempotency"))
        self.db.execute(_INDEX)

    def claim(self, key: str, fingerprint: str, *, principal: str = "") -> Claim:
        """Take the key for a new request, or say why not (see :meth:`IdempotencyStore.claim`).

        Call it inside a transaction that also ends with :meth:`finish` or a rollback:
        a claim committed without its result holds the key until its lease lapses,
        and is :class:`Abandoned` from then on (see :func:`~durably.receivers._keys.judge`).
        """
        now = self.clock().timestamp()
        cutoff = now - self.ttl.total_seconds()
        row = self._row(key, principal)
        outcome = judge(row, fingerprint, now=now, cutoff=cutoff) if row else None
        if outcome is not None:
            return outcome
        token = secrets.token_hex(16)
        self.db.execute(
            "INSERT OR REPLACE INTO durably_idempotency"
            " (principal, key, fingerprint, token, state, started_at, finished_at,"
            " result, owner, lease_until)"
            " VALUES (?, ?, ?, ?, 'running', ?, NULL, NULL, ?, ?)",
            (
                principal,
                key,
                fingerprint,
                token,
                now,
                owner_name(),
                now + self.lease.total_seconds(),
            ),
        )
        # Expired results are dead weight; their rows stay as tombstones.
        self.db.execute(
            "UPDATE durably_idempotency SET result = NULL"
            " WHERE result IS NOT NULL AND started_at <= ?",
            (cutoff,),
        )
        return Claimed(key, token, principal)

    def renew(self, claim: Claimed) -> bool:
        """Extend a running request's lease; False if it finished or was taken over."""
        cursor = self.db.execute(
            "UPDATE durably_idempotency SET lease_until = ?"
            " WHERE principal = ? AND key = ? AND token = ? AND state = 'running'",
            (
                self.clock().timestamp() + self.lease.total_seconds(),
                claim.principal,
                claim.key,
                claim.token,
            ),
        )
        return cursor.rowcount == 1

    def finish(self, claim: Claimed, result: Stored) -> bool:
        """Store a claimed request's result; False if the claim expired and was taken over."""
        return self.finish_encoded(claim, encode_result(result))

    def finish_encoded(self, claim: Claimed, result: bytes) -> bool:
        """:meth:`finish` with the result already encoded (msgspec JSON of a ``Stored``)."""
        cursor = self.db.execute(
            "UPDATE durably_idempotency SET state = 'done', finished_at = ?, result = ?"
            " WHERE principal = ? AND key = ? AND token = ? AND state = 'running'",
            (self.clock().timestamp(), result, claim.principal, claim.key, claim.token),
        )
        return cursor.rowcount == 1

    def record(self, key: str, *, principal: str = "") -> KeyRecord:
        """What the table knows about ``key``: done, in flight, abandoned, expired or unknown."""
        now = self.clock().timestamp()
        return describe(
            self._row(key, principal), key, now=now, cutoff=now - self.ttl.total_seconds()
        )

    def _row(self, key: str, principal: str) -> KeyRow | None:
        found = self.db.execute(
            "SELECT fingerprint, state, started_at, finished_at, result, owner, lease_until"
            " FROM durably_idempotency WHERE principal = ? AND key = ?",
            (principal, key),
        ).fetchone()
        if found is None:
            return None
        fingerprint, state, started, finished, result, owner, lease_until = found
        return KeyRow(
            key=key,
            fingerprint=fingerprint,
            state=state,
            started_at=started,
            finished_at=finished,
            result=result,
            owner=owner,
            lease_until=lease_until,
        )

    def forget_expired(self) -> int:
        """Delete every key older than the TTL, its tombstone too; return how many.

        A forgotten key looks never seen: a lookup answers "unknown", which lets an
        agent run an in-doubt call again. Only for a service that must bound its
        table and accepts that; :class:`IdempotencyStore` never forgets a key.
        """
        cutoff = self.clock().timestamp() - self.ttl.total_seconds()
        cursor = self.db.execute("DELETE FROM durably_idempotency WHERE started_at <= ?", (cutoff,))
        return cursor.rowcount


_BUSY_TIMEOUT: Final = 30.0
"""Seconds a statement (and the first-open setup, in all) waits for another process's lock."""


def _check_database(path: Path) -> tuple[int, int]:
    """Create the database 0600 or check it is ours, with its directory and side files.

    The stores' trust rules (:func:`~durably.stores._guard.check_trusted`): the
    directory, the database and any ``-wal`` or ``-shm`` beside it must be owned by
    this user and writable by no one else, and be a directory or regular files;
    a symlink at any of the file names is refused, its target untouched. Another
    user's file there could hand this service forged responses, or delete a key
    so a retry runs twice. An own file readable by others is tightened to 0600
    (SQLite gives the side files the database's mode: all three hold response
    bodies). Returns the database's (device, inode), to check SQLite opened it.

    Raises:
        UnsafePath: naming the path, what it is, its owner and mode.
    """
    directory = str(path.parent)
    try:
        check_trusted(os.stat(directory), path=directory, directory=True)
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"{directory}: the key database's directory does not exist"
        ) from exc
    identity = (0, 0)
    for name in (str(path), f"{path}-wal", f"{path}-shm"):
        main = name == str(path)
        flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(name, flags | (os.O_RDWR | os.O_CREAT if main else os.O_RDONLY), 0o600)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                kind = describe_kind(os.lstat(name).st_mode)
                raise UnsafePath(path=name, reason=f"it is not a regular file ({kind})") from exc
            raise
        try:
            info = os.fstat(fd)
            check_trusted(info, path=name)
            if stat.S_IMODE(info.st_mode) != 0o600:
                os.fchmod(fd, 0o600)  # new: a umask only ever removes bits; old: tightened
            if main:
                identity = (info.st_dev, info.st_ino)
        finally:
            os.close(fd)
    return identity


def _same_file(path: Path, identity: tuple[int, int]) -> None:
    """Refuse a database swapped for another file between its check and SQLite's open."""
    info = os.lstat(path)
    if (info.st_dev, info.st_ino) != identity:
        raise UnsafePath(path=str(path), reason="it was replaced while it was being opened")


def _retry_while_busy(set_up: Callable[[], None], *, path: Path) -> None:
    """Run ``set_up``, retrying ``database is locked`` with growing, jittered waits.

    The retries are stamina's (``durably``'s one retry policy); this boundary only
    judges what is worth another try (SQLite busy or locked, for up to
    :data:`_BUSY_TIMEOUT`) and how long to wait, in stamina's backoff hook.
    """
    import stamina

    deadline = time.monotonic() + _BUSY_TIMEOUT
    pause = 0.01

    def backoff(exc: Exception) -> bool | float:
        # stamina's backoff hook: a float is the wait before the next try, False gives up.
        nonlocal pause
        busy = isinstance(exc, sqlite3.OperationalError) and (
            "locked" in str(exc) or "busy" in str(exc)
        )
        if not busy or time.monotonic() >= deadline:
            return False
        wait = random.uniform(pause / 2, pause)  # noqa: S311 -- spreads retries; not a secret
        pause = min(pause * 2, 0.5)
        log.info("%s: %s; setting it up again in %.3f s", path, exc, wait)
        return wait

    for attempt in stamina.retry_context(on=backoff, attempts=None, timeout=None):
        with attempt:
            set_up()
            return
    raise AssertionError("unreachable: stamina ends with a return or an exception")
