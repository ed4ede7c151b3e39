"""What every receiver key store shares: the records, the claim outcomes and their rules.

A key store (the SQLite :class:`~durably.receivers.IdempotencyStore`, the
:class:`~durably.receivers.postgres.PostgresIdempotencyStore`) keeps rows; what a
row means is decided here once: :func:`judge` says what a new request with the
key gets, :func:`describe` what a lookup answers, :func:`renewing` holds a
running request's lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hashlib
import logging
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol

import msgspec

__all__ = [
    "DEFAULT_LEASE",
    "MAX_KEY_LENGTH",
    "Abandoned",
    "Busy",
    "Claim",
    "Claimed",
    "KeyRecord",
    "KeyRow",
    "KeyState",
    "KeyStore",
    "Mismatch",
    "Replay",
    "Stored",
    "StoredOutcome",
    "StoredResponse",
    "Unstored",
    "decode_result",
    "describe",
    "encode_result",
    "judge",
    "owner_name",
    "principal_digest",
    "renewing",
    "valid_key",
]

log = logging.getLogger("durably.receivers")


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
    """A request with this key started, and its owner still holds its lease."""
    ABANDONED = "abandoned"
    """Its request's process died (the lease lapsed) and it may have acted: nobody can tell."""
    ROLLED_BACK = "rolled-back"
    """Its request's process died and its effect, transactional with the key, died with it."""
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
    owner: str | None = None
    """Who ran or runs the request (``host:pid``), when in flight, abandoned or rolled back."""
    lease_until: datetime | None = None
    """When the owner's lease ends (ended); None for a key written before leases."""


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


@dataclass(frozen=True)
class Abandoned(Busy):
    """The request with this key died with its process, and it may have acted.

    A :class:`Busy` (code written before it refuses the key, never runs it
    again); the receiver answers it as final, and its lookup says ``abandoned``.
    """

    owner: str = ""
    lease_until: datetime | None = None


Claim = Claimed | Replay | Mismatch | Busy

MAX_KEY_LENGTH: Final = 255
DEFAULT_LEASE: Final = timedelta(seconds=30)
"""How long a running request holds its key unrenewed: a dead one's key settles this long after."""

_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(Stored)


class KeyStore(Protocol):
    """What the middleware, the MCP helper and the lookup need of a key store."""

    lease: timedelta

    async def claim(
        self,
        key: str,
        fingerprint: str,
        *,
        principal: str = "",
        wait: float = 0.0,
        transactional: bool = False,
    ) -> Claim:
        """Take the key for a new request, or say why not."""
        ...

    async def finish(self, claim: Claimed, result: Stored) -> bool:
        """Store a claimed request's result; False if the claim was taken over."""
        ...

    async def renew(self, claim: Claimed) -> bool:
        """Extend a running request's lease; False if the claim was taken over or finished."""
        ...

    async def record(self, key: str, *, principal: str = "") -> KeyRecord:
        """What the store knows about ``key`` under ``principal``."""
        ...


@dataclass(frozen=True, kw_only=True)
class KeyRow:
    """One stored key as both stores read it (times as POSIX seconds)."""

    key: str
    fingerprint: str
    state: str
    started_at: float
    finished_at: float | None
    result: bytes | None
    owner: str | None
    lease_until: float | None
    transactional: bool = False


def judge(row: KeyRow, fingerprint: str, *, now: float, cutoff: float) -> Claim | None:
    """What a new request with ``row``'s key gets; None: it takes the key and runs.

    One rule for every key store: a key past its TTL is new; another request is
    a mismatch; a finished key replays; a running key with a live lease (or none:
    written before leases) is busy; a lapsed one was abandoned by a dead process,
    and runs again only when its effect was transactional with the key (it rolled
    back with the process), else it stays :class:`Abandoned`.
    """
    if not _live(row.state, row.started_at, row.result, cutoff):
        return None
    if row.fingerprint != fingerprint:
        return Mismatch()
    if row.state != "running":
        return Replay(_DECODER.decode(row.result or b""))
    if row.lease_until is None or row.lease_until > now:
        return Busy()
    if row.transactional:
        return None
    return Abandoned(owner=row.owner or "", lease_until=_time(row.lease_until))


def describe(row: KeyRow | None, key: str, *, now: float, cutoff: float) -> KeyRecord:
    """The :class:`KeyRecord` a lookup of ``key`` answers from its stored ``row``."""
    if row is None:
        return KeyRecord(key=key, state=KeyState.UNKNOWN)
    started_at = _time(row.started_at)
    finished_at = _time(row.finished_at)
    if not _live(row.state, row.started_at, row.result, cutoff):
        return KeyRecord(
            key=key, state=KeyState.EXPIRED, started_at=started_at, finished_at=finished_at
        )
    if row.state == "running":
        lapsed = row.lease_until is not None and row.lease_until <= now
        state = KeyState.IN_FLIGHT
        if lapsed:
            state = KeyState.ROLLED_BACK if row.transactional else KeyState.ABANDONED
        return KeyRecord(
            key=key,
            state=state,
            started_at=started_at,
            owner=row.owner,
            lease_until=_time(row.lease_until),
        )
    return KeyRecord(
        key=key,
        state=KeyState.DONE,
        started_at=started_at,
        finished_at=finished_at,
        result=_DECODER.decode(row.result or b""),
    )


def owner_name() -> str:
    """This process, as a key's owner: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


@asynccontextmanager
async def renewing(store: KeyStore, claim: Claimed) -> AsyncIterator[None]:
    """Renew ``claim``'s lease every third of the lease while the body runs.

    A renewal that fails (the store unreachable a moment) is logged and tried
    again next time; the lease only lapses if no renewal lands for a whole lease.
    """
    interval = store.lease.total_seconds() / 3

    async def renew_forever() -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                if not await store.renew(claim):
                    return  # finished, or taken over after a stall: nothing left to hold
            except Exception:
                log.exception("renewing the lease of idempotency key %s failed", claim.key)

    task = asyncio.create_task(renew_forever())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _time(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


def encode_result(result: Stored) -> bytes:
    """A result as a key store keeps it."""
    return _ENCODER.encode(result)


def decode_result(data: bytes) -> Stored:
    """A result a key store kept."""
    return _DECODER.decode(data)


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
