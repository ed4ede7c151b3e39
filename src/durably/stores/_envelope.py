"""The checksummed envelope a snapshot is written in.

A snapshot file is one JSON object: ``{"durably": 1, "crc32": N, "state": {...}}``.
The checksum covers the exact bytes of ``state``, so a torn write or garbage
bytes are reported as ``CheckpointCorrupt`` rather than as a confusing decode
error, while the file stays readable in any editor.

A journal store's snapshot also names the generation of the log that continues
it. That number decides what the checkpoint means (which log is replayed, which
ones are stale), so it is covered by the checksum too: such a snapshot is
written as envelope version 2, ``{"durably": 2, "crc32": N, "journal": G,
"state": {...}}``, whose checksum is the CRC-32 of ``G`` and ``state`` together.
Version 1 with a ``journal`` field (written before version 2 existed) is still
read; the journal store rewrites it as version 2 at its next save.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import msgspec

from ..errors import CheckpointCorrupt
from ..state import RunState, decode_state, encode_state

__all__ = ["Opened", "open_envelope", "open_sealed", "open_snapshot", "seal"]


class _Envelope(msgspec.Struct, kw_only=True, omit_defaults=True):
    durably: int
    crc32: int
    journal: int = 0
    """For the journal store: the generation of the log that continues this snapshot."""
    state: msgspec.Raw


@dataclass(frozen=True, slots=True)
class Opened:
    """A checked snapshot: its state, its log generation (0: none) and envelope version."""

    state: RunState
    journal: int
    version: int


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(_Envelope)


def _checksum(body: bytes, journal: int, version: int) -> int:
    if version == 1:
        return zlib.crc32(body)
    return zlib.crc32(body, zlib.crc32(b"journal %d\n" % journal))


def seal(state: RunState, *, journal: int = 0) -> bytes:
    """Encode a state inside its checksummed envelope (version 2 when it names a log)."""
    body = encode_state(state)
    version = 2 if journal else 1
    envelope = _Envelope(
        durably=version,
        crc32=_checksum(body, journal, version),
        journal=journal,
        state=msgspec.Raw(body),
    )
    return _encoder.encode(envelope)


def open_envelope(data: bytes, *, path: str) -> RunState:
    """Check and decode an envelope; anything wrong is ``CheckpointCorrupt`` naming ``path``."""
    return open_sealed(data, path=path).state


def open_snapshot(data: bytes, *, path: str) -> tuple[RunState, int]:
    """Like :func:`open_envelope`, also returning the journal generation (0: none)."""
    opened = open_sealed(data, path=path)
    return opened.state, opened.journal


def open_sealed(data: bytes, *, path: str) -> Opened:
    """Check and decode an envelope, with the journal generation and the envelope version."""
    if not data:
        raise CheckpointCorrupt(path=path, reason="the file is empty")
    try:
        envelope = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CheckpointCorrupt(path=path, reason=f"torn or not a checkpoint ({exc})") from exc
    except RecursionError as exc:
        raise CheckpointCorrupt(path=path, reason="JSON nested too deeply") from exc
    if envelope.durably not in (1, 2):
        raise CheckpointCorrupt(path=path, reason=f"unknown envelope version {envelope.durably}")
    if envelope.journal < 0:
        raise CheckpointCorrupt(path=path, reason=f"log generation {envelope.journal}")
    body = bytes(envelope.state)
    if _checksum(body, envelope.journal, envelope.durably) != envelope.crc32:
        raise CheckpointCorrupt(path=path, reason="checksum mismatch (torn or altered content)")
    state = decode_state(body, path=path)
    return Opened(state=state, journal=envelope.journal, version=envelope.durably)
