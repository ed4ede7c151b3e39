"""Where a receiver keeps its idempotency keys: one SQLite file, durable on every commit.

A key goes through two states. ``claim`` inserts it as *running* with a
fingerprint of the request (method, path and body, or tool and arguments) and a
random claim token; ``finish`` stores the result the request produced and marks
it *done*. Both are single transactions (``BEGIN IMMEDIATE``), so two workers
sharing the file never both run the same key. The database runs in WAL mode
with ``synchronous=FULL``: a finished key survives a crash or power cut of the
service.

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
import enum
import errno
import hashlib
import logging
import os
import random
import secrets
import sqlite3
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, TypeVar

import msgspec

from ..errors import UnsafePath
from ..state import utcnow
from ..stores._guard import check_trusted, describe_kind

__all__ = [
    "Busy",
    "Claimed",
    "IdempotencyStore",
    "KeyRecord",
    "KeyState",
    "KeyTable",
    "Mismatch",
    "Replay",
    "Stored",
    "StoredOutcome",
    "StoredResponse",
    "Unstored",
    "principal_digest",
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


class StoredResponse(msgspec.Struct, tag="http", frozen=True, kw_only=True):
    """An HTTP response as first sent for a key, replayed byte for byte."""

    status: int
    headers: list[tuple[str, str]]
    """Header names in lowercase, in the order the application sent them."""
    body: bytes


class StoredOutcome(msgspec.Struct, tag="mcp", frozen=True, kw_only=True):
    """What an MCP tool function returned (or raised) for a key."""

    value: Any = None
    """The return value in its JSON form, when the function returned."""
    error: str | None = None
    """The exception's message, when the function raised."""
    tool_error: bool = False
    """True when the exception was the SDK's ``ToolError`` (its text reaches the client as is)."""


class Unstored(msgspec.Struct, tag="unstored", frozen=True, kw_only=True):
    """A key whose response was too large to keep: it was sent once and is never replayed."""

    status: int
    limit: int
    """The ``max_response`` it went over, in bytes."""


Stored = StoredResponse | StoredOutcome | Unstored


class KeyState(enum.StrEnum):
    """What a receiver knows about a key."""

    DONE = "done"
    """Processed; the result is stored."""
    IN_FLIGHT = "in-flight"
    """A request with this key started and has not finished (or its process died)."""
    EXPIRED = "expired"
    """Seen once, but older than the TTL: the result is gone and the key counts as new."""
    UNKNOWN = "unknown"
    """Never seen by this store."""


@dataclass(frozen=True, kw_only=True)
class KeyRecord:
    """A key's state and, when done, the result it produced."""

    key: str
    state: KeyState
    started_at: datetime | None = None
    finished_at: datetime | None = None
    result: Stored | None = None


@dataclass(frozen=True)
class Claimed:
    """This request owns the key: run it, then ``finish`` with its result."""

    key: str
    token: str
    principal: str = ""


@dataclass(frozen=True)
class Replay:
    """The key was processed before: answer with this result."""

    result: Stored


@dataclass(frozen=True)
class Mismatch:
    """The key was used before with different parameters."""


@dataclass(frozen=True)
class Busy:
    """Another request with this key is still running."""


Claim = Claimed | Replay | Mismatch | Busy

MAX_KEY_LENGTH: Final = 255
FORMAT: Final = 2
"""The database layout's version, kept in SQLite's ``user_version``."""

_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(Stored)


class IdempotencyStore:
    """A receiver's idempotency keys and the results they produced, in one SQLite file.

    Args:
        path: the database file (created if missing; its directory must exist).
        ttl: how long a key is remembered; tell agents a slightly shorter
            ``key_ttl``. Default 24 hours, as Stripe.
        clock: the time source for key ages (tests move it).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        ttl: timedelta = timedelta(hours=24),
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        if ttl <= timedelta(0):
            raise ValueError(f"ttl must be positive, got {ttl}")
        self.path = Path(path)
        self.ttl = ttl
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
            KeyTable(db).create()
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
        self, key: str, fingerprint: str, *, principal: str = "", wait: float = 0.0
    ) -> Claim:
        """Take the key for a new request, or say why not.

        ``principal`` is the sender's :func:`principal_digest` ("" for nobody in
        particular): the same key under another principal is another key.
        While another request holds the key, poll for up to ``wait`` seconds
        for it to finish, then answer :class:`Busy`.
        """
        deadline = time.monotonic() + max(wait, 0.0)
        pause = 0.01
        while True:
            outcome = await self._run(self._claim, key, fingerprint, principal)
            if not isinstance(outcome, Busy) or time.monotonic() >= deadline:
                return outcome
            await asyncio.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
            pause = min(pause * 2, 0.1)

    async def finish(self, claim: Claimed, result: Stored) -> bool:
        """Store a claimed request's result; False if the claim expired and was taken over."""
        return await self._run(self._finish, claim, _ENCODER.encode(result))

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
        return KeyTable(self._db, ttl=self.ttl, clock=self.clock)

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
    ) -> None:
        if ttl <= timedelta(0):
            raise ValueError(f"ttl must be positive, got {ttl}")
        self.db = db
        self.ttl = ttl
        self.clock = clock

    def create(self) -> None:
        """Create the table and its index if the database has none (its version is the caller's)."""
        self.db.execute(_TABLE.format(name="durably_idempotency"))
        self.db.execute(_INDEX)

    def claim(self, key: str, fingerprint: str, *, principal: str = "") -> Claim:
        """Take the key for a new request, or say why not (see :meth:`IdempotencyStore.claim`).

        Call it inside a transaction that also ends with :meth:`finish` or a rollback:
        a claim committed without its result is :class:`Busy` to every request until the TTL.
        """
        now = self.clock().timestamp()
        cutoff = now - self.ttl.total_seconds()
        db = self.db
        row = db.execute(
            "SELECT fingerprint, state, started_at, result FROM durably_idempotency"
            " WHERE principal = ? AND key = ?",
            (principal, key),
        ).fetchone()
        if row is not None and _live(row[1], row[2], row[3], cutoff):
            stored_fingerprint, state, _, result = row
            if stored_fingerprint != fingerprint:
                return Mismatch()
            if state == "running":
                return Busy()
            return Replay(_DECODER.decode(result))
        token = secrets.token_hex(16)
        db.execute(
            "INSERT OR REPLACE INTO durably_idempotency"
            " (principal, key, fingerprint, token, state, started_at, finished_at,"
            " result) VALUES (?, ?, ?, ?, 'running', ?, NULL, NULL)",
            (principal, key, fingerprint, token, now),
        )
        # Expired results are dead weight; their rows stay as tombstones.
        db.execute(
            "UPDATE durably_idempotency SET result = NULL"
            " WHERE result IS NOT NULL AND started_at <= ?",
            (cutoff,),
        )
        return Claimed(key, token, principal)

    def finish(self, claim: Claimed, result: Stored) -> bool:
        """Store a claimed request's result; False if the claim expired and was taken over."""
        return self.finish_encoded(claim, _ENCODER.encode(result))

    def finish_encoded(self, claim: Claimed, result: bytes) -> bool:
        """:meth:`finish` with the result already encoded (msgspec JSON of a ``Stored``)."""
        cursor = self.db.execute(
            "UPDATE durably_idempotency SET state = 'done', finished_at = ?, result = ?"
            " WHERE principal = ? AND key = ? AND token = ? AND state = 'running'",
            (self.clock().timestamp(), result, claim.principal, claim.key, claim.token),
        )
        return cursor.rowcount == 1

    def record(self, key: str, *, principal: str = "") -> KeyRecord:
        """What the table knows about ``key``: done, in flight, expired or unknown."""
        row = self.db.execute(
            "SELECT state, started_at, finished_at, result FROM durably_idempotency"
            " WHERE principal = ? AND key = ?",
            (principal, key),
        ).fetchone()
        if row is None:
            return KeyRecord(key=key, state=KeyState.UNKNOWN)
        state, started, finished, result = row
        started_at = datetime.fromtimestamp(started, UTC)
        finished_at = datetime.fromtimestamp(finished, UTC) if finished is not None else None
        if not _live(state, started, result, self.clock().timestamp() - self.ttl.total_seconds()):
            return KeyRecord(
                key=key, state=KeyState.EXPIRED, started_at=started_at, finished_at=finished_at
            )
        if state == "running":
            return KeyRecord(key=key, state=KeyState.IN_FLIGHT, started_at=started_at)
        return KeyRecord(
            key=key,
            state=KeyState.DONE,
            started_at=started_at,
            finished_at=finished_at,
            result=_DECODER.decode(result),
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


def principal_digest(principal: str | bytes | None) -> str:
    """A short digest naming a principal without storing its credentials ("" for none).

    The digest, not the credential, goes into the stored key: the database then
    holds no token or cookie a reader of the file could reuse.
    """
    if not principal:
        return ""
    data = principal.encode("utf-8") if isinstance(principal, str) else principal
    return hashlib.sha256(b"durably-principal\0" + data).hexdigest()[:32]


def valid_key(key: str) -> bool:
    """A key a receiver accepts: 1 to 255 printable ASCII characters, no spaces."""
    return 0 < len(key) <= MAX_KEY_LENGTH and all("!" <= c <= "~" for c in key)


def _live(state: str, started_at: float, result: bytes | None, cutoff: float) -> bool:
    """A row the TTL has not expired (a done row always keeps its result until then)."""
    return started_at > cutoff and (state == "running" or result is not None)
