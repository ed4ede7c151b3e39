"""The checksummed envelope a snapshot is written in.

A snapshot file is one JSON object: ``{"durably": 1, "crc32": N, "state": {...}}``.
The checksum covers the exact bytes of ``state``, so a torn write or garbage
bytes are reported as ``CheckpointCorrupt`` rather than as a confusing decode
error, while the file stays readable in any editor.
"""

from __future__ import annotations

import zlib

import msgspec

from ..errors import CheckpointCorrupt
from ..state import RunState, decode_state, encode_state

__all__ = ["open_envelope", "open_snapshot", "seal"]


class _Envelope(msgspec.Struct, kw_only=True, omit_defaults=True):
    durably: int
    crc32: int
    journal: int = 0
    """For the journal store: the generation of the log that continues this snapshot."""
    state: msgspec.Raw


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(_Envelope)


def seal(state: RunState, *, journal: int = 0) -> bytes:
    """Encode a state inside its checksummed envelope."""
    body = encode_state(state)
    envelope = _Envelope(
        durably=1, crc32=zlib.crc32(body), journal=journal, state=msgspec.Raw(body)
    )
    return _encoder.encode(envelope)


def open_envelope(data: bytes, *, path: str) -> RunState:
    """Check and decode an envelope; anything wrong is ``CheckpointCorrupt`` naming ``path``."""
    return open_snapshot(data, path=path)[0]


def open_snapshot(data: bytes, *, path: str) -> tuple[RunState, int]:
    """Like :func:`open_envelope`, also returning the journal generation (0: none)."""
    if not data:
        raise CheckpointCorrupt(path=path, reason="the file is empty")
    try:
        envelope = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CheckpointCorrupt(path=path, reason=f"torn or not a checkpoint ({exc})") from exc
    if envelope.durably != 1:
        raise CheckpointCorrupt(path=path, reason=f"unknown envelope version {envelope.durably}")
    body = bytes(envelope.state)
    if zlib.crc32(body) != envelope.crc32:
        raise CheckpointCorrupt(path=path, reason="checksum mismatch (torn or altered content)")
    return decode_state(body, path=path), envelope.journal
