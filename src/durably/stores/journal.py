"""The journal store: one append and one flush per save, bytes in proportion to the change.

Per run, in the state directory (0700)::

    <run>.json         a snapshot in the checksummed envelope, naming its log generation G
                       (inside the checksum)
    <run>.<G>.log      a header record, then records appended since that snapshot (0600)
    <run>.lock         flock'ed by the owner; never deleted; holds the watermark

A save that only appended messages and changed a few fields appends one record
holding just that change, by the framed log's one append
(:class:`~durably.stores.framedlog.FramedLog`): on Linux one ``write`` on a log
opened with ``O_DSYNC`` into space reserved ahead (the reserve is given back at
close, and a new owner cuts reserved zeros as it cuts a torn tail); elsewhere a
``write`` and a flush. A record is

    magic (4 bytes) | length (4, little-endian) | CRC-32 of length and payload (4) | payload

where the payload is JSON: ``{"seq": n, "add": [messages...], "set": {field: value},
"put": {field: {key: value}}, "drop": {field: [key...]}}``. A field that is a
dict (the workspace, the approvals given, the resolutions...) changes by the
keys that changed (``put``, ``drop``) rather than whole, so a record's size,
and the encoding behind it, follow the change and not the run's age.
When history is rewritten (the context policy's summary) or the log grows past
a multiple of the snapshot, the store compacts: it creates the log of
generation G+1 holding only its header record (``{"seq": 0, "run": ..., "gen":
G+1}``, synced), then writes a new snapshot naming G+1 with the crash-atomic
protocol, whose directory sync also keeps the new log's name; only then is the
old log removed. So a snapshot of envelope version 2 or 3 always has its log, and a
missing, emptied or foreign log is ``CheckpointCorrupt``.

Envelope versions: 3 is a snapshot whose log may hold ``put``/``drop`` records;
2 (written before them) is one whose log cannot, so that a durably too old to
know them refuses the snapshot (unknown version) instead of reading the log
and skipping fields it does not know. A run opened from a version 1 or 2
snapshot is compacted into version 3 at its first save, before anything new is
appended to a log an older durably could read.

The watermark: after each save is durable the owner writes ``(G, last seq)``
into its lock file (24 bytes with their own CRC, no sync: a process crash keeps
it, a power cut may lose it). A log that ends before the watermark's sequence
number, or a snapshot older than the watermark's generation, lost saves that
were acknowledged: ``CheckpointCorrupt``, never a quiet cut.

Recovery: load the snapshot, replay its generation's log. A torn tail (a record
that never finished its flush: short, or failing its checksum with nothing valid
after it) is cut off unless the watermark shows it was acknowledged; a bad
record with a valid record after it is ``CheckpointCorrupt``, never skipped.
docs/design.md ("What the journal detects") lists what is and is not detected.
"""

from __future__ import annotations

import os
import struct
import time
import zlib
from collections.abc import Sequence
from contextlib import suppress

from .. import faults
from .._sysio import FileSystem, logger
from ..checkpoint.delta import Changes, Record, apply, decode_record, encode_record
from ..errors import CheckpointCorrupt
from ..state import RunState, check_ranges, utcnow
from .file import FileRun, FileStore
from .framedlog import FramedLog, cut_tail, frame, log_name, payloads, unframe

__all__ = ["JournalRun", "JournalStore"]

_NOFOLLOW = os.O_NOFOLLOW
_WATERMARK = struct.Struct("<4sQQI")
_WATERMARK_MAGIC = b"DJw1"
_READ_ATTEMPTS = 10
"""A lock-free reader retries a refused load this many times in all (see ``_load``)."""


_KEYED_VERSION = 3
"""The envelope version from which a snapshot's log may hold ``put``/``drop`` records."""


def _watermark(generation: int, seq: int) -> bytes:
    head = _WATERMARK_MAGIC + struct.pack("<QQ", generation, seq)
    return head + struct.pack("<I", zlib.crc32(head))


def _read_watermark(data: bytes) -> tuple[int, int] | None:
    """(generation, seq) from a lock file's bytes, or None when it holds no whole watermark."""
    if len(data) < _WATERMARK.size:
        return None
    magic, generation, seq, crc = _WATERMARK.unpack_from(data)
    if magic != _WATERMARK_MAGIC or zlib.crc32(data[: _WATERMARK.size - 4]) != crc:
        return None
    return generation, seq


class JournalStore(FileStore):
    """Runs as a snapshot plus an append-only log of changes (see the module docstring).

    A :class:`FileStore` whose runs carry a framed log
    (:class:`~durably.stores.framedlog.FramedLog`, held by each run's handle) after
    their snapshot: it reads both layouts and makes journal runs.

    Args:
        directory: the state directory.
        sync: fsync/fdatasync; off only in tests that do not model power loss.
        compact_ratio: compact when the log is larger than this many snapshots...
        compact_min_bytes: ...and larger than this.
        fs: the system-call seam.
        allow_network_fs: see :class:`FileStore`.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        sync: bool = True,
        compact_ratio: float = 4.0,
        compact_min_bytes: int = 1 << 20,
        fs: FileSystem | None = None,
        allow_network_fs: bool = False,
    ) -> None:
        super().__init__(directory, sync=sync, fs=fs, allow_network_fs=allow_network_fs)
        self._listed: Sequence[str] | None = None
        """Set only inside :meth:`read_listed_sync`: the names standing in for a listing."""
        self.compact_ratio = compact_ratio
        self.compact_min_bytes = compact_min_bytes

    def read_listed_sync(self, run_id: str, names: Sequence[str]) -> RunState:
        """:meth:`read_sync` for a lister that has listed the directory already.

        ``names`` (the directory's names of this run's files) stand in for listing
        the directory to find the run's logs: per run, that listing made reading
        every run of a directory quadratic in its size. A refusal is not trusted
        to the given names (a compaction may have made a log since): the run is
        then read again with the directory listed afresh. Not for a store other
        threads read through at the same time.
        """
        self._listed = names
        try:
            return self.read_sync(run_id)
        except CheckpointCorrupt:
            pass
        finally:
            self._listed = None
        return self.read_sync(run_id)

    def _read_listed(self, run_id: str, names: Sequence[str] | None) -> RunState:
        # Prune reads every run of the directory: with its listing, not one per run.
        return self.read_sync(run_id) if names is None else self.read_listed_sync(run_id, names)

    def _new_handle(self, run_id: str, lock_fd: int) -> JournalRun:
        return JournalRun(self, run_id, lock_fd)

    def _load(self, run_id: str, *, owner: FileRun | None = None) -> RunState:
        if owner is not None:
            return self._load_once(run_id, owner=owner)
        # A reader takes no lock: an owner saving or compacting meanwhile can make
        # one reading inconsistent (a watermark newer than the log it read). Real
        # damage stays; a race does not, so only a repeated refusal stands.
        attempt = 1
        while True:
            before = self._files_now(run_id)
            try:
                return self._load_once(run_id, owner=None)
            except CheckpointCorrupt:
                if attempt >= _READ_ATTEMPTS or self._files_now(run_id) == before:
                    raise  # nothing moved while it was read: the damage is real
            time.sleep(0.002 * attempt)
            attempt += 1

    def _files_now(self, run_id: str) -> list[tuple[str, int, int, int]]:
        """Name, inode, size and change time of the run's snapshot, lock and logs."""
        dir_fd = self.run_directory.fd()
        names = [
            run_id + ".json",
            run_id + ".lock",
            *(name for name, _ in self._logs(run_id)),
        ]
        found = []
        for name in sorted(names):
            info = self.fs.lstat(name, dir_fd=dir_fd)
            if info is not None:
                found.append((name, info.st_ino, info.st_size, info.st_mtime_ns))
        return found

    def _load_once(self, run_id: str, *, owner: FileRun | None) -> RunState:
        directory = self.run_directory
        opened, snapshot_size = self._read_snapshot(run_id)
        state, generation = opened.state, opened.journal
        if generation == 0:  # a snapshot-store run: nothing to replay
            if isinstance(owner, JournalRun):
                owner.adopt(state, generation=0, log_size=0, snapshot_size=snapshot_size, seq=0)
            return state
        name = log_name(run_id, generation)
        path = directory.path(name)
        self._check_other_logs(run_id, generation)
        # The watermark before the log: it is written after the records it counts.
        mark = _read_watermark(directory.read_trusted(run_id + ".lock", run_id) or b"")
        data = directory.read_trusted(name, run_id)
        legacy = opened.version == 1
        if data is None:
            if not legacy:
                raise CheckpointCorrupt(
                    path=path,
                    reason=f"the snapshot {self.describe(run_id)} names this log and it is "
                    "missing (deleted, or the snapshot was altered)",
                )
            data = b""  # a version-1 snapshot: compacted and nothing appended since
        header = None if legacy else (run_id, generation)
        keyed = opened.version >= _KEYED_VERSION
        seq, valid = _replay(state, data, path=path, header=header, keyed=keyed)
        self._check_watermark(run_id, mark, generation, seq, log=path)
        check_ranges(state, path=path)
        if isinstance(owner, JournalRun):
            if valid < len(data):  # a torn tail that never finished its flush
                cut_tail(owner.claim, name, valid)
            self._remove_stale_logs(run_id, generation)
            owner.adopt(
                state, generation=generation, log_size=valid, snapshot_size=snapshot_size, seq=seq
            )
            owner.fresh = not keyed  # rewrite an older snapshot as version 3 first
        return state

    def _check_other_logs(self, run_id: str, generation: int) -> None:
        """A log newer than the snapshot holding saves means the snapshot went back in time.

        A newer log holding only its header is left by a compaction that died
        before its snapshot's rename: nothing in it was ever acknowledged.
        """
        directory = self.run_directory
        for name, other in self._logs(run_id):
            if other <= generation:
                continue
            data = directory.read_trusted(name, run_id) or b""
            framed = unframe(data, 0)
            if framed is not None and unframe(data, framed[1]) is not None:
                raise CheckpointCorrupt(
                    path=self.describe(run_id),
                    reason=f"it names log generation {generation} but {directory.path(name)} "
                    f"(generation {other}) holds later saves: the snapshot was replaced "
                    "by an older one or altered",
                )

    def _check_watermark(
        self, run_id: str, mark: tuple[int, int] | None, generation: int, seq: int, *, log: str
    ) -> None:
        """Refuse a snapshot or log that lost a save its owner acknowledged."""
        lock = self.run_directory.path(run_id + ".lock")
        if mark is None:
            return
        marked_generation, marked_seq = mark
        if marked_generation > generation:
            raise CheckpointCorrupt(
                path=self.describe(run_id),
                reason=f"it names log generation {generation}, but its owner had already "
                f"saved in generation {marked_generation} (watermark in {lock}): "
                "the snapshot was replaced by an older one or altered",
            )
        if marked_generation == generation and marked_seq > seq:
            raise CheckpointCorrupt(
                path=log,
                reason=f"it ends after record {seq}, but records up to {marked_seq} were "
                f"saved and acknowledged (watermark in {lock}): the log was "
                "truncated or its last records damaged",
            )

    def _logs(self, run_id: str) -> list[tuple[str, int]]:
        """This run's log files and their generations (exact names: run ``a`` is not ``a.b``)."""
        return self.run_directory.generations(run_id, ".log", names=self._listed)

    def _remove_stale_logs(self, run_id: str, generation: int) -> None:
        """Remove the run's logs of other generations than ``generation``."""
        self.run_directory.remove_generations(run_id, ".log", keep=generation)


def _replay(
    state: RunState,
    data: bytes,
    *,
    path: str,
    header: tuple[str, int] | None,
    keyed: bool = True,
) -> tuple[int, int]:
    """Apply the log's valid records to ``state``; return (last seq, valid byte length).

    ``header`` is the (run, generation) the log's first record must name; None
    for a log continuing a version-1 snapshot, which has no header record.
    ``keyed``: the snapshot's version allows ``put``/``drop`` records.
    """
    offset, seq = 0, 0
    if header is not None:
        offset = _check_header(data, header, path=path)
    for payload, start, end in payloads(data, offset, path=path):
        record = decode_record(payload, path=path, where=f"byte {start}")
        if record.seq != seq + 1:
            raise CheckpointCorrupt(
                path=path, reason=f"record {record.seq} at byte {start} follows {seq}"
            )
        if (record.put or record.drop) and not keyed:
            raise CheckpointCorrupt(
                path=path,
                reason=f"record {record.seq} changes fields by key, which a log of a "
                "version 1 or 2 snapshot cannot hold",
            )
        apply(state, record, path=path)
        seq, offset = record.seq, end
    return seq, offset


def _check_header(data: bytes, header: tuple[str, int], *, path: str) -> int:
    """Check the log's header record names ``header``; return the offset after it."""
    framed = unframe(data, 0)
    if framed is not None:
        first = decode_record(framed[0], path=path, where="byte 0")
        if first.seq == 0 and (first.run, first.gen) == header:
            return framed[1]
    found = "nothing" if not data else "no header record for it"
    raise CheckpointCorrupt(
        path=path,
        reason=f"it should start with the header of run {header[0]!r}, generation "
        f"{header[1]}, and holds {found} (truncated, or another log put there)",
    )


class JournalRun(FileRun):
    """Ownership of one run in a :class:`JournalStore`: its snapshot and the log after it."""

    def __init__(self, store: JournalStore, run_id: str, lock_fd: int) -> None:
        super().__init__(store, run_id, lock_fd)
        self._journal = store
        self._generation = 0
        self._seq = 0
        self._log = FramedLog(self.claim, log_name(run_id, 0))
        self._snapshot_size = 0
        self._changes = Changes()
        """What the store holds: the next record is the change from it."""
        self.fresh = True
        """The next save compacts (a snapshot-store run, or an older envelope version)."""

    def adopt(
        self, state: RunState, *, generation: int, log_size: int, snapshot_size: int, seq: int
    ) -> None:
        """Take what a load found as what the disk holds (called by the store that loaded it)."""
        self._generation, self._seq = generation, seq
        self._log = FramedLog(self.claim, log_name(self._run_id, generation), size=log_size)
        self._snapshot_size = snapshot_size
        self._remember(state)
        self.fresh = generation == 0  # a snapshot-store run compacts into a journal first

    def _remember(self, state: RunState) -> None:
        """Take ``state`` as what the disk holds (after a load or a compaction)."""
        self._changes.remember(state)

    def close_sync(self) -> None:
        """Give back the log's unused reserved space; release the log descriptor and the lock."""
        self._log.give_back()
        self._log.close()
        super().close_sync()

    def save_sync(self, state: RunState) -> None:
        """Append the change since the last save, or compact when that is due."""
        self.claim.check_usable()
        state.saved_at = utcnow()
        if self.fresh or self._changes.rewritten(state) or self._log_due():
            self._compact(state)
        else:
            record, after = self._changes.record(state, self._seq + 1)
            self._append(frame(record))
            # Only now, the save durable: what the next record is the change from.
            self._seq += 1
            self._changes.saved(after)
        self._served(state)

    def _log_due(self) -> bool:
        store = self._journal
        return (
            self._log.size > store.compact_min_bytes
            and self._log.size > store.compact_ratio * self._snapshot_size
        )

    def _append(self, record: bytes) -> None:
        log = self._log
        if log.fd is None:
            # Compaction made this log with its header; it is never created here.
            fs, dir_fd = self._journal.fs, self.claim.directory.fd()
            flags = os.O_WRONLY | _NOFOLLOW | os.O_NONBLOCK | log.flags()
            fd = self.claim.step(lambda: fs.open(log.name, flags, 0, dir_fd=dir_fd), log.name)
            log.attach(fd)
        log.append(record)
        self._mark(self._generation, self._seq + 1)

    def _mark(self, generation: int, seq: int) -> None:
        """Record in the lock file that saves up to ``seq`` of ``generation`` are durable.

        No sync: it guards against a log truncated or damaged after the fact (the
        page cache keeps it through a crash of this process); a power cut may lose
        it, and then only what the log itself shows is detected.
        """
        fd = self.claim.lock_fd
        if fd is None:
            return
        try:
            # Straight to the kernel, not through the FileSystem seam: this write is
            # never synced, so a power cut can only leave an older, torn or absent
            # watermark, each of which the load treats as weaker or absent. Were the
            # power-loss model to enumerate those states it would check up to 8 times
            # as many disks at every crash point and learn nothing new.
            os.pwrite(fd, _watermark(generation, seq), 0)
        except OSError as exc:  # the save itself is durable: only the detection aid is lost
            logger("durably.store").warning(
                "could not write the watermark of run %s: %s", self._run_id, exc
            )

    def _new_log(self, generation: int) -> FramedLog:
        """Create generation ``generation``'s log holding its synced header record."""
        claim, fs = self.claim, self._journal.fs
        directory = claim.directory
        header = frame(encode_record(Record(seq=0, run=self._run_id, gen=generation)))
        log = FramedLog(claim, log_name(self._run_id, generation), size=len(header))
        name = log.name
        dir_fd = directory.fd()
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | os.O_NONBLOCK | log.flags()
        try:
            fd = fs.open(name, flags, 0o600, dir_fd=dir_fd)
        except FileExistsError:
            # Left by a compaction that died before its snapshot's rename (the load
            # checked it holds no saves): nothing in it was ever acknowledged.
            fs.unlink(name, dir_fd=dir_fd)
            fd = claim.step(lambda: fs.open(name, flags, 0o600, dir_fd=dir_fd), name)
        except OSError as exc:
            raise directory.translate(exc, name, self._run_id) from exc
        try:
            claim.step(lambda: fs.write(fd, header), name)
            if directory.sync:
                if not log.flags():  # else the write was its own flush (O_DSYNC)
                    claim.step(lambda: fs.datasync(fd), name)
                # The log's name must be durable before the snapshot naming it is
                # renamed in: directory operations on two names may persist out of order.
                claim.step(lambda: fs.fsync(dir_fd), str(directory.directory), fatal=True)
        except BaseException:
            fs.close(fd)
            with suppress(OSError):
                fs.unlink(name, dir_fd=dir_fd)
            raise
        log.attach(fd)
        return log

    def _compact(self, state: RunState) -> None:
        fs = self._journal.fs
        old = self._generation
        generation = old + 1
        data = self._sealer.seal(state, journal=generation, version=_KEYED_VERSION)
        log = self._new_log(generation)
        try:
            self._write_snapshot(data)  # crash-atomic; its directory sync keeps the new log too
        except BaseException:
            log.close()
            raise
        self._log.close()
        self._log = log
        if old:
            # Only now, after the new snapshot's directory sync: removing the old log
            # earlier could lose acknowledged saves if the rename were undone.
            with suppress(FileNotFoundError):
                fs.unlink(log_name(self._run_id, old), dir_fd=self.claim.directory.fd())
        faults.point("store.compact.done")
        self._generation, self._seq = generation, 0
        self._snapshot_size = len(data)
        self.fresh = False
        self._remember(state)
        self._mark(generation, 0)
