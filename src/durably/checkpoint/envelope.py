r"""The checksummed envelope a snapshot is written in.

A snapshot file is one JSON object: ``{"durably": 1, "crc32": N, "state": {...}}``.
The checksum covers the exact bytes of ``state``, so a torn write or garbage
bytes are reported as ``CheckpointCorrupt`` rather than as a confusing decode
error, while the file stays readable in any editor.

A journal store's snapshot also names the generation of the log that continues
it. That number decides what the checkpoint means (which log is replayed, which
ones are stale), so it is covered by the checksum too: such a snapshot is
written as envelope version 3 (or 2, before its log could hold keyed changes:
see :mod:`durably.stores.journal`), ``{"durably": 3, "crc32": N, "journal": G,
"state": {...}}``, whose checksum is the CRC-32 of ``journal G\n`` and ``state``
together. Version 1 with a ``journal`` field (written before version 2 existed)
is still read; the journal store rewrites it at its next save. The Postgres store
puts the same field to the same use: there it is the number of the save that
wrote the snapshot, which its row's later changes continue.

Writing: :class:`Sealer` keeps the encoded messages of the last state it sealed
and their running CRC, so a save encodes and checksums only the messages added
since, and the few other fields. The state's messages are written first
(``{"messages": [...], "format": 1, ...}``; a JSON object's order means nothing
to a reader), which is what lets their bytes and CRC be kept from one save to
the next.

Reading: the body is found by the envelope's known prefix, not by parsing the
state twice; anything else (an edited file, other whitespace) takes the general
path, with the same checks and errors.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from ..errors import CheckpointCorrupt
from ..state import Message, RunState, decode_state

if TYPE_CHECKING:
    import threading

__all__ = ["VERSIONS", "Opened", "Sealer", "open_envelope", "open_sealed", "open_snapshot", "seal"]

VERSIONS = (1, 2, 3)
"""Envelope versions this code reads: 1 (plain or legacy journal), 2 and 3 (journal)."""


class _Envelope(msgspec.Struct, kw_only=True, omit_defaults=True):
    durably: int
    crc32: int
    journal: int = 0
    """What continues this snapshot: the journal store's log generation, or the Postgres
    store's save number (whose changes follow it)."""
    state: msgspec.Raw


@dataclass(frozen=True, slots=True)
class Opened:
    """A checked snapshot: its state, its log generation (0: none) and envelope version."""

    state: RunState
    journal: int
    version: int


_decoder = msgspec.json.Decoder(_Envelope)
_NUMBER = rb"(0|[1-9][0-9]{0,19})"
_PREFIX = re.compile(
    rb'\{"durably":%s,"crc32":%s,(?:"journal":%s,)?"state":' % (_NUMBER, _NUMBER, _NUMBER)
)
_RESERVE = 96
"""Bytes kept free before the state for the envelope's prefix (its longest form is 71)."""
_MESSAGES = b'{"messages":['


def _seed(journal: int, version: int) -> int:
    """The CRC the state's bytes are continued from: nothing for version 1."""
    return 0 if version == 1 else zlib.crc32(b"journal %d\n" % journal)


def _checksum(body: bytes | memoryview, journal: int, version: int) -> int:
    return zlib.crc32(body, _seed(journal, version))


class Sealer:
    """Seals successive states of one run, encoding only what changed since the last seal.

    The messages already encoded are kept (with their CRC) while the state's
    message list is the same list, grown at its end: the list object, its first
    message and the last one encoded are the same objects. The loop appends to
    ``messages`` and rewrites history by assigning a new list (the context
    policy), so either holds; anything else starts again from nothing. Not for
    use by two threads at once (a handle saves one state at a time).
    """

    def __init__(self, buffer: bytearray | None = None) -> None:
        self._encoder = msgspec.json.Encoder()
        self._buffer = bytearray() if buffer is None else buffer
        """Reused from save to save: memory already touched costs no page faults."""
        self._messages: list[Message] | None = None
        self._count = 0
        self._first: Message | None = None
        self._last: Message | None = None
        self._end = 0
        """Where the encoded messages end in the buffer (after the last one, no ``]``)."""
        self._seed: int | None = None
        self._crc = 0
        """CRC of the seed and the buffer from ``_RESERVE`` to ``_end``."""

    def seal(self, state: RunState, *, journal: int = 0, version: int | None = None) -> bytes:
        """The envelope of ``state`` (version 1 without a log, else ``version``, default 3)."""
        if version is None:
            version = 3 if journal else 1
        if (version == 1) != (journal == 0) or version not in VERSIONS:
            raise ValueError(f"envelope version {version} with log generation {journal}")
        buffer = self._buffer
        seed = _seed(journal, version)
        messages = state.messages
        if not self._continues(messages):
            # Overwritten in place, never cut here: the buffer keeps its memory
            # (the encoding below sets its length).
            start = _RESERVE + len(_MESSAGES)
            if len(buffer) < start:
                buffer.extend(bytes(start - len(buffer)))
            buffer[_RESERVE:start] = _MESSAGES
            self._messages, self._count, self._first, self._last = messages, 0, None, None
            self._end = start
            self._seed, self._crc = seed, zlib.crc32(_MESSAGES, seed)
        elif seed != self._seed:  # another log generation: the cached bytes, checksummed anew
            with memoryview(buffer) as view:
                self._crc = zlib.crc32(view[_RESERVE : self._end], seed)
            self._seed = seed
        if len(messages) > self._count:
            self._append(messages)
        # Everything but the messages, as ``],"format":1,...}``: a few hundred bytes.
        end = self._end
        rest = msgspec.structs.replace(state, messages=[])
        self._encoder.encode_into(rest, buffer, end + 1)
        buffer[end] = 0x5D  # ]
        buffer[end + 1] = 0x2C  # , (replacing the rest's opening brace)
        with memoryview(buffer) as view:
            crc = zlib.crc32(view[end:], self._crc)
        buffer.append(0x7D)  # } closing the envelope
        prefix = b'{"durably":%d,"crc32":%d,' % (version, crc)
        if journal:
            prefix += b'"journal":%d,' % journal
        prefix += b'"state":'
        start = _RESERVE - len(prefix)
        buffer[start:_RESERVE] = prefix
        with memoryview(buffer) as view:
            return bytes(view[start:])

    def _continues(self, messages: list[Message]) -> bool:
        """True when the kept bytes encode the start of ``messages``."""
        count = self._count
        if messages is not self._messages or len(messages) < count:
            return False
        return count == 0 or (messages[0] is self._first and messages[count - 1] is self._last)

    def _append(self, messages: list[Message]) -> None:
        """Encode the messages after the kept ones onto the buffer, extending the CRC."""
        buffer, count, end = self._buffer, self._count, self._end
        # ``[a,b]`` written where the kept messages end; its ``[`` becomes the
        # separator (or stays the list's own ``[`` when none is kept) and its ``]`` is cut.
        at = end if count else end - 1
        self._encoder.encode_into(messages[count:], buffer, at)
        if count:
            buffer[at] = 0x2C  # ,
        new_end = len(buffer) - 1
        with memoryview(buffer) as view:
            self._crc = zlib.crc32(view[end:new_end], self._crc)
        self._end = new_end
        self._count = len(messages)
        self._first, self._last = messages[0], messages[-1]


_scratch: threading.local | None = None
"""Made on the first seal: a process that only reads a store never loads ``threading``."""


def seal(state: RunState, *, journal: int = 0, version: int | None = None) -> bytes:
    """Encode a state inside its checksummed envelope (see :meth:`Sealer.seal`), from nothing.

    The encoding buffer is kept per thread, so a large state sealed again does
    not pay for fresh memory (a 500 KB seal took 213 page faults without it).
    """
    global _scratch  # made once, on first use
    if _scratch is None:
        import threading

        _scratch = threading.local()
    buffer: bytearray | None = getattr(_scratch, "buffer", None)
    if buffer is None:
        buffer = _scratch.buffer = bytearray()
    return Sealer(buffer).seal(state, journal=journal, version=version)


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
    found = _PREFIX.match(data)
    if found is not None and data.endswith(b"}"):
        # As written: the state is everything between the prefix and the last brace.
        version, crc, journal = int(found[1]), int(found[2]), int(found[3] or 0)
        body = memoryview(data)[found.end() : -1]
        if version in VERSIONS and _checksum(body, journal, version) == crc:
            state = decode_state(body, path=path)
            return Opened(state=state, journal=journal, version=version)
    # Not as written, or damaged: the general path, which says what is wrong.
    return _open_parsed(data, path=path)


def _open_parsed(data: bytes, *, path: str) -> Opened:
    try:
        envelope = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CheckpointCorrupt(path=path, reason=f"torn or not a checkpoint ({exc})") from exc
    except RecursionError as exc:
        raise CheckpointCorrupt(path=path, reason="JSON nested too deeply") from exc
    if envelope.durably not in VERSIONS:
        raise CheckpointCorrupt(path=path, reason=f"unknown envelope version {envelope.durably}")
    if envelope.journal < 0:
        raise CheckpointCorrupt(path=path, reason=f"log generation {envelope.journal}")
    body = bytes(envelope.state)
    if _checksum(body, envelope.journal, envelope.durably) != envelope.crc32:
        raise CheckpointCorrupt(path=path, reason="checksum mismatch (torn or altered content)")
    state = decode_state(body, path=path)
    return Opened(state=state, journal=envelope.journal, version=envelope.durably)
