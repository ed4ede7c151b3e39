"""A framed log: checksummed records appended one at a time, and the torn-tail rule, once.

The journal store's run logs (:mod:`durably.stores.journal`) and the LangGraph
saver's thread logs both *hold* a :class:`FramedLog` for each log they append to,
and read logs back through :func:`payloads`. A record is::

    magic (4 bytes) | length (4, little-endian) | CRC-32 of length and payload (4) | payload

What the payload holds is the store's business (JSON changes of a run, msgpack
records of a thread).

The torn-tail rule: a record that is short or fails its checksum, with nothing
valid after it, is one append that never finished its flush: it was never
acknowledged and ends the log (the owner cuts it before appending again). A bad
record with a valid record after it is damage (``CheckpointCorrupt``), never
skipped. Space reserved ahead of the end reads as zeros, which the rule reads
as the end of the log: no record starts with a zero byte.

The append (:meth:`FramedLog.append`) is the one way either store makes a record
durable: reserve space when the reservation runs out, one ``write``, then a
``fdatasync`` unless the descriptor was opened with ``O_DSYNC`` (whose ``write``
returns once the record and the size it reaches are durable, in one system call).
"""

from __future__ import annotations

import os
import struct
import sys
import zlib
from collections.abc import Iterator

from .. import faults
from .._sysio import logger
from ..errors import CheckpointCorrupt
from .rundir import Claim

__all__ = [
    "DSYNC",
    "HEADER",
    "MAGIC",
    "FramedLog",
    "cut_tail",
    "damage_after",
    "frame",
    "log_name",
    "payloads",
    "unframe",
]

MAGIC = b"\xd7DJr"
"""The first bytes of every record (never a zero byte: reserved space reads as the end)."""
HEADER = struct.Struct("<4sII")
"""The frame before each payload: magic, length, CRC-32."""
_LENGTH = struct.Struct("<I")
SCAN_CANDIDATES = 4096
"""At most this many candidate records are checked after a damaged one (bounds the scan)."""
DSYNC = os.O_DSYNC if sys.platform == "linux" else 0
"""Linux only: elsewhere (macOS) ``O_DSYNC`` leaves the data in the drive's cache, and the
append calls ``FileSystem.datasync`` (``F_FULLFSYNC`` there) after its write."""
MIN_RESERVE = 256 << 10
"""Space reserved ahead of a log's end when it runs out: as much as the log holds, but at
least this much, so that the log lies in one or two extents (docs/design.md, LangGraph saver)..."""
MAX_RESERVE = 8 << 20
"""...and at most this much."""


def frame(payload: bytes) -> bytes:
    """``payload`` framed as a record: magic, length, CRC-32, payload."""
    # The CRC runs over length then payload without joining them (no copy of the payload).
    crc = zlib.crc32(payload, zlib.crc32(_LENGTH.pack(len(payload))))
    return HEADER.pack(MAGIC, len(payload), crc) + payload


def unframe(data: bytes, offset: int) -> tuple[bytes, int] | None:
    """The payload at ``offset`` and the offset after it, or None when it is not a whole record."""
    if offset + HEADER.size > len(data):
        return None
    magic, length, crc = HEADER.unpack_from(data, offset)
    end = offset + HEADER.size + length
    if magic != MAGIC or end > len(data):
        return None
    payload = data[offset + HEADER.size : end]
    if zlib.crc32(payload, zlib.crc32(_LENGTH.pack(length))) != crc:
        return None
    return payload, end


def damage_after(data: bytes, offset: int) -> str | None:
    """Why the bytes from ``offset`` are not a torn tail, or None when they may be one.

    A torn tail is one unfinished append: a whole record after it means a record
    in the middle was damaged. Each candidate costs a CRC over its claimed length,
    so crafted garbage (magic bytes every few bytes) could make an unbounded scan
    quadratic: after ``SCAN_CANDIDATES`` candidates the tail is refused as damage.
    """
    position = data.find(MAGIC, offset + 1)
    for _ in range(SCAN_CANDIDATES):
        if position == -1:
            return None
        if unframe(data, position) is not None:
            return f"a damaged record at byte {offset} with records after it"
        position = data.find(MAGIC, position + 1)
    if position == -1:
        return None
    return (
        f"the {len(data) - offset} bytes after byte {offset} are not one unfinished append "
        f"(more than {SCAN_CANDIDATES} record headers in them)"
    )


def payloads(data: bytes, offset: int = 0, *, path: str) -> Iterator[tuple[bytes, int, int]]:
    """Each whole record's payload from ``offset`` on, with its start and end offsets.

    Ends at a torn tail (the caller sees where from the last end); raises
    ``CheckpointCorrupt`` naming ``path`` when the bad bytes are damage instead.
    """
    while offset < len(data):
        framed = unframe(data, offset)
        if framed is None:
            damage = damage_after(data, offset)
            if damage is not None:
                raise CheckpointCorrupt(path=path, reason=damage)
            return  # a torn tail
        payload, end = framed
        yield payload, offset, end
        offset = end


def log_name(stem: str, generation: int) -> str:
    """The name of a run's (or a thread's) log of one generation: ``<stem>.<G>.log``."""
    return f"{stem}.{generation}.log"


class FramedLog:
    """One log, as its owner appends to it.

    Args:
        claim: the owner's claim on the run (its directory, its error translation).
        name: the log's file name in the directory.
        size: the end of the last whole record (where the next append goes).
    """

    def __init__(self, claim: Claim, name: str, *, size: int = 0) -> None:
        self.claim = claim
        self.name = name
        self.size = size
        """The end of the last whole record."""
        self.fd: int | None = None
        self.reserved = 0
        """The file's size: past ``size``, space reserved by this owner (zeros)."""
        self.reserving = False
        self.dsync = False
        """The descriptor was opened with ``O_DSYNC``: its writes are its syncs."""
        self.name_unsynced = False
        """The log was just created: its first append also syncs the directory."""

    def flags(self) -> int:
        """What the owner adds to the flags it opens the log with: ``O_DSYNC`` when syncing."""
        return DSYNC if self.claim.directory.sync else 0

    def attach(self, fd: int, *, name_unsynced: bool = False) -> None:
        """Append through ``fd``, opened by the owner with :meth:`flags`.

        The owner cut any tail after the last whole record: the end is where to
        write. When syncing, space is reserved ahead of the end as it runs out
        (on file systems where that spares the sync a journal commit).
        ``name_unsynced``: the owner has just created the log, and its first
        append syncs the directory.
        """
        directory = self.claim.directory
        self.fd = fd
        self.dsync = bool(self.flags())
        self.name_unsynced = name_unsynced
        self.reserved = directory.fs.seek_end(fd)
        self.reserving = directory.sync and directory.reserves_space()

    def append(self, record: bytes, *, translate: bool = True) -> None:
        """Make a framed ``record`` durable at the end of the log: reserve, write, flush.

        ``translate``: a failed system call raises durably's error and, when it
        was a sync, breaks the claim; else the ``OSError`` itself (for a caller
        appending without the lock that guards the claim: it breaks the claim
        itself, under that lock).
        """
        directory = self.claim.directory
        fs, fd = directory.fs, self.fd
        if fd is None:
            raise RuntimeError(f"the log {self.name} is not open")  # its owner opens it first
        end = self.size + len(record)
        if end > self.reserved and self.reserving:
            self._reserve(fd, end)
        try:  # not through Claim.step: no closure per append
            fs.write(fd, record)
        except OSError as exc:
            if not translate:
                raise
            # On an O_DSYNC descriptor a failed write may be a failed flush.
            raise self.claim.failed(exc, self.name, directory.sync and self.dsync) from exc
        faults.point("store.append.written")
        if directory.sync and not self.dsync:
            try:
                fs.datasync(fd)
            except OSError as exc:
                if not translate:
                    raise
                raise self.claim.failed(exc, self.name, True) from exc
        if self.name_unsynced:
            if directory.sync:  # the log's directory entry must survive with its first record
                dir_fd = directory.fd()
                self.claim.step(lambda: fs.fsync(dir_fd), str(directory.directory), fatal=True)
            self.name_unsynced = False
        self.size = end
        faults.point("store.append.synced")

    def _reserve(self, fd: int, end: int) -> None:
        """Reserve space past ``end`` (as much as the log holds, within bounds).

        Best effort: where it fails (a full disk), appends go on growing the file,
        and the write itself reports a full disk.
        """
        size = end + min(max(end, MIN_RESERVE), MAX_RESERVE)
        try:
            self.reserving = self.claim.directory.fs.allocate(fd, self.size, size - self.size)
        except OSError as exc:
            logger("durably.store").info("could not reserve space for %s: %s", self.name, exc)
            self.reserving = False
            return
        if self.reserving:
            self.reserved = size

    def give_back(self) -> None:
        """Cut the reserved space this owner did not use (zeros; no sync needed)."""
        fd = self.fd
        if fd is None or self.reserved <= self.size or self.claim.broken is not None:
            return
        try:
            self.claim.directory.fs.truncate(fd, self.size)
        except OSError as exc:  # the zeros read as the end of the log: nothing is lost
            logger("durably.store").info("could not trim %s: %s", self.name, exc)
        self.reserved = self.size

    def close(self) -> None:
        """Close the descriptor (the log stays as it is)."""
        if self.fd is not None:
            self.claim.directory.fs.close(self.fd)
            self.fd = None


def cut_tail(claim: Claim, name: str, size: int) -> None:
    """Cut a log after its last whole record (a torn append, or reserved zeros), durably."""
    directory = claim.directory
    fs, dir_fd = directory.fs, directory.fd()
    fd = claim.step(lambda: fs.open(name, os.O_WRONLY | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd), name)
    try:
        fs.truncate(fd, size)
        if directory.sync:
            fs.datasync(fd)
    finally:
        fs.close(fd)
