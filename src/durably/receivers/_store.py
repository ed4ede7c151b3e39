"""Where a receiver keeps its idempotency keys: one SQLite file, durable on every commit.

A key goes through two states. ``claim`` inserts it as *running* with a
fingerprint of the request (method, path and body, or tool and arguments) and a
random claim token; ``finish`` stores the result the request produced and marks
it *done*. Both are single transactions (``BEGIN IMMEDIATE``), so two workers
sharing the file never both run the same key. The database runs in WAL mode
with ``synchronous=FULL``: a finished key survives a crash or power cut of the
service.

Keys are scoped by principal, as Stripe scopes them by account: a receiver
stores a client's key as :func:`scoped_key` of a digest of who sent it (its
credentials, or the identity the service names) and the key, so the same key
from another principal is another key, never a replay of someone else's result.

A key older than the TTL counts as no key: a new request with it runs again.
Its row is kept as a tombstone (its result dropped), so a lookup can tell "I
forgot" from "I never saw it"; only the second may be answered "not found".

All SQLite calls run in a worker thread (``asyncio.to_thread``) under one lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hashlib
import logging
import os
import random
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, TypeVar

import msgspec

from ..state import utcnow

__all__ = [
    "Busy",
    "Claimed",
    "IdempotencyStore",
    "KeyRecord",
    "KeyState",
    "Mismatch",
    "Replay",
    "Stored",
    "StoredOutcome",
    "StoredResponse",
    "principal_digest",
    "scoped_key",
    "valid_key",
]

log = logging.getLogger("durably.receivers")

_T = TypeVar("_T")

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS durably_idempotency (
    key TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    token TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('running', 'done')),
    started_at REAL NOT NULL,
    finished_at REAL,
    result BLOB
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS durably_idempotency_payloads
    ON durably_idempotency (started_at) WHERE result IS NOT NULL;
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


Stored = StoredResponse | StoredOutcome


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
FORMAT: Final = 1
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
        _make_private(self.path)
        # One connection shared by worker threads, serialized by the lock;
        # autocommit mode so every transaction below is explicit.
        self._db = sqlite3.connect(
            self.path, timeout=_BUSY_TIMEOUT, isolation_level=None, check_same_thread=False
        )
        try:
            _retry_while_busy(self._set_up, path=self.path)
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
        (version,) = self._db.execute("PRAGMA user_version").fetchone()
        if version > FORMAT:
            raise RuntimeError(
                f"{self.path} holds idempotency keys in format {version}; this durably "
                f"reads format {FORMAT}: upgrade durably, or give the store a new file"
            )
        self._db.executescript(_SCHEMA)
        self._db.execute(f"PRAGMA user_version = {FORMAT}")

    def close(self) -> None:
        """Close the database; the store cannot be used afterwards."""
        with self._lock:
            self._db.close()

    async def claim(self, key: str, fingerprint: str, *, wait: float = 0.0) -> Claim:
        """Take the key for a new request, or say why not.

        While another request holds the key, poll for up to ``wait`` seconds
        for it to finish, then answer :class:`Busy`.
        """
        deadline = time.monotonic() + max(wait, 0.0)
        pause = 0.01
        while True:
            outcome = await self._run(self._claim, key, fingerprint)
            if not isinstance(outcome, Busy) or time.monotonic() >= deadline:
                return outcome
            await asyncio.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
            pause = min(pause * 2, 0.1)

    async def finish(self, claim: Claimed, result: Stored) -> bool:
        """Store a claimed request's result; False if the claim expired and was taken over."""
        return await self._run(self._finish, claim, _ENCODER.encode(result))

    async def record(self, key: str) -> KeyRecord:
        """What the store knows about ``key``."""
        return await self._run(self._record, key)

    # -- blocking parts, run in a worker thread -------------------------------------------

    async def _run(self, function: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.to_thread(self._locked, function, *args)

    def _locked(self, function: Callable[..., _T], *args: Any) -> _T:
        with self._lock:
            return function(*args)

    def _claim(self, key: str, fingerprint: str) -> Claim:
        now = self.clock().timestamp()
        cutoff = now - self.ttl.total_seconds()
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute(
                "SELECT fingerprint, state, started_at, result FROM durably_idempotency"
                " WHERE key = ?",
                (key,),
            ).fetchone()
            outcome: Claim
            if row is not None and _live(row[1], row[2], row[3], cutoff):
                stored_fingerprint, state, _, result = row
                if stored_fingerprint != fingerprint:
                    outcome = Mismatch()
                elif state == "running":
                    outcome = Busy()
                else:
                    outcome = Replay(_DECODER.decode(result))
            else:
                token = secrets.token_hex(16)
                db.execute(
                    "INSERT OR REPLACE INTO durably_idempotency"
                    " (key, fingerprint, token, state, started_at, finished_at, result)"
                    " VALUES (?, ?, ?, 'running', ?, NULL, NULL)",
                    (key, fingerprint, token, now),
                )
                # Expired results are dead weight; their rows stay as tombstones.
                db.execute(
                    "UPDATE durably_idempotency SET result = NULL"
                    " WHERE result IS NOT NULL AND started_at <= ?",
                    (cutoff,),
                )
                outcome = Claimed(key, token)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return outcome

    def _finish(self, claim: Claimed, result: bytes) -> bool:
        cursor = self._db.execute(
            "UPDATE durably_idempotency SET state = 'done', finished_at = ?, result = ?"
            " WHERE key = ? AND token = ? AND state = 'running'",
            (self.clock().timestamp(), result, claim.key, claim.token),
        )
        return cursor.rowcount == 1

    def _record(self, key: str) -> KeyRecord:
        row = self._db.execute(
            "SELECT state, started_at, finished_at, result FROM durably_idempotency WHERE key = ?",
            (key,),
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


_BUSY_TIMEOUT: Final = 30.0
"""Seconds a statement (and the first-open setup, in all) waits for another process's lock."""


def _make_private(path: Path) -> None:
    """Create the database file 0600 (never through a symlink), or take away others' access.

    SQLite gives its ``-wal`` and ``-shm`` files the database file's mode, so
    all three hold response bodies (tokens, cookies) only the service user can read.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        info = os.lstat(path)
        if info.st_uid == os.geteuid() and info.st_mode & 0o077:
            for name in (path, *(Path(f"{path}{suffix}") for suffix in ("-wal", "-shm"))):
                with contextlib.suppress(FileNotFoundError):
                    os.chmod(name, 0o600, follow_symlinks=False)
        return
    os.fchmod(fd, 0o600)  # a umask only ever removes bits; this is exact
    os.close(fd)


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


def scoped_key(principal: str, key: str) -> str:
    """The key as stored: ``<principal digest>/<key>``, or the key alone for no principal."""
    return f"{principal}/{key}" if principal else key


def valid_key(key: str) -> bool:
    """A key a receiver accepts: 1 to 255 printable ASCII characters, no spaces."""
    return 0 < len(key) <= MAX_KEY_LENGTH and all("!" <= c <= "~" for c in key)


def _live(state: str, started_at: float, result: bytes | None, cutoff: float) -> bool:
    """A row the TTL has not expired (a done row always keeps its result until then)."""
    return started_at > cutoff and (state == "running" or result is not None)
