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

__all__ = ["open_envelope", "seal"]


class _Envelope(msgspec.Struct, kw_only=True):
    durably: int
    crc32: int
    state: msgspec.Raw


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(_Envelope)


def seal(state: RunState) -> bytes:
    """Encode a state inside its checksummed envelope."""
    body = encode_state(state)
    return _encoder.encode(_Envelope(durably=1, crc32=zlib.crc32(body), state=msgspec.Raw(body)))


def open_envelope(data: bytes, *, path: str) -> RunState:
    """Check and decode an envelope; anything wrong is ``CheckpointCorrupt`` naming ``path``."""
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
    return decode_state(body, path=path)
