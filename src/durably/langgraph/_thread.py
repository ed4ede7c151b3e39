"""One LangGraph thread on disk: a small header, an append-only log, a lock.

Per thread, in the saver's directory (0700), named after the thread (``<key>``
is the thread ID when it is made of letters, digits, ``-`` and ``_``, else
``x.`` and a SHA-256 of it)::

    <key>.json        {"format": 3, "thread_id": ..., "generation": G, "crc": ...}, replaced
                      crash-atomically; the CRC-32 covers the three fields before it
    <key>.<G>.log     the thread's records, each written and flushed by one put (or, in a
                      format 2 thread, put_writes), and those a rewrite carries
    <key>.<G>.wlog    format 3: the tasks' pending writes, each written and flushed by one
                      put_writes; made (empty) with the log, so a missing one is damage
    <key>.lock        flock'ed by the one process writing the thread; never deleted

The pending writes have a log of their own so that a ``put`` need not wait
for the step's ``put_writes`` to be flushed (LangGraph starts the next
checkpoint's ``put`` while the step's writes are still being saved): each log
is appended by one call at a time, in order, so each keeps the torn-tail rule
below, and neither log's records refer to the other's. A checkpoint made
durable while the writes of its parent are not yet is no loss: those writes
were not acknowledged, and the checkpoint after them no longer needs them.
Format 2 threads (one log for both) are read and written as they are, until a
rewrite (prune, delete_for_runs, copy_thread) makes them format 3.

The thread store holds what the file stores hold, rather than copying them: a
run directory (``durably.stores.rundir``: the directory, trust checks, flock,
temp files, the crash-atomic header write, errors) and, per log, a framed log
(``durably.stores.framedlog``: the checksummed records, the torn-tail rule, the
reservation and the one append). Only the records are its own. A record is a
msgpack array, one of

- ``p`` a checkpoint: namespace, ID, parent ID, the serialized checkpoint without
  its channel values, the serialized metadata, the run ID, and a blob per channel
  in ``new_versions``;
- ``w`` a task's pending writes for one checkpoint;
- ``b`` a blob on its own (written by rewrites: prune, delete_for_runs, copy_thread).

Records in the main log are numbered 1, 2, ... in order; records in the
writes log (``w`` only) have a numbering of their own, also from 1.

A blob is a whole value, or, when the channel's new value is a list that extends
the value last stored for that channel, only the appended items and the sequence
number of the record holding the value it extends. Reads rebuild the list.

On Linux the append is one ``write`` on a descriptor opened with ``O_DSYNC``:
the write returns once its data is on stable storage, as ``write`` +
``fdatasync`` would, in one system call (elsewhere it is ``write`` + the
``FileSystem.datasync`` flush; ``durably.stores.framedlog``). The owner reserves
the log's space ahead of its end (``posix_fallocate``, in chunks), so that an
append does not grow the file and its sync need not commit a new size to the
file system's journal. Reserved space reads as zeros, which the tail rule reads
as the end of the log: no record starts with a zero byte. The owner gives back
what it did not use when it lets the thread go; a new owner cuts any tail (zeros
or a torn record) before it appends.

Rewrites (prune, delete_for_runs, the target of copy_thread) write the kept
records into the log of the next generation (created, written, flushed, directory
synced), then replace the header naming it; only after the header's directory
sync is the old log removed. A crash at any point leaves the old header with its
complete log, or the new header with its complete log.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from collections import deque
from contextlib import suppress
from pathlib import Path
from typing import Any

import msgspec

from .. import faults
from .._sysio import FileSystem
from ..errors import CheckpointCorrupt, Locked, SaveFailed
from ..stores.framedlog import FramedLog, cut_tail, log_name
from ..stores.rundir import Claim, RunDirectory
from ._records import (
    FORMAT,
    HEADER_DECODER,
    SPLIT_FORMAT,
    WRITES_SUFFIX,
    Header,
    Index,
    Node,
    Record,
    Writes,
    frame,
    header,
    header_crc,
    replay,
    replay_writes,
    writes_log_name,
)
from ._records import Put as Put  # the tests read records through this module
from ._records import records as records

__all__ = ["ThreadLocked", "thread_key"]

_NOFOLLOW = os.O_NOFOLLOW
_HEADER_SUFFIX = ".json"
_LOCK_SUFFIX = ".lock"
_PLAIN_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")
log = logging.getLogger("durably.store")


class ThreadLocked(Locked):
    """Raised at once when another process is writing the thread; nothing was written."""

    __module__ = "durably.langgraph"

    def __init__(self, *, thread_id: str, path: str) -> None:
        super().__init__(run_id=thread_id, path=path)
        self.thread_id = thread_id
        Exception.__init__(
            self,
            f"thread {thread_id!r} is being written by another process (lock {path}); "
            "a second writer would fork its checkpoint chain, so nothing was written; "
            "wait for that process to finish or stop it (its lock is freed the moment "
            "it exits or closes its saver)",
        )


def thread_key(thread_id: str) -> str:
    """The file name stem of a thread: its ID when that is safe as a name, else a digest."""
    if not isinstance(thread_id, str):
        raise TypeError(f"thread_id must be a string, not {type(thread_id).__name__}")
    if _PLAIN_KEY.fullmatch(thread_id):
        return thread_id
    return "x." + hashlib.sha256(thread_id.encode("utf-8", "surrogatepass")).hexdigest()[:40]


# -- the store and its handles -----------------------------------------------------------


class ThreadStore:
    """The saver's directory of threads; it holds a run directory, as the file stores do."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        sync: bool = True,
        fs: FileSystem | None = None,
        allow_network_fs: bool = False,
    ) -> None:
        self.run_directory = RunDirectory(
            directory, sync=sync, fs=fs or FileSystem(), allow_network_fs=allow_network_fs
        )

    @property
    def directory(self) -> Path:
        """The saver's directory."""
        return self.run_directory.directory

    @property
    def sync(self) -> bool:
        """Whether files and the directory are synced."""
        return self.run_directory.sync

    @property
    def fs(self) -> FileSystem:
        """The system-call seam."""
        return self.run_directory.fs

    def close_sync(self) -> None:
        """Close the directory's descriptor (handles keep their own)."""
        self.run_directory.close()

    def claim_sync(self, thread_id: str) -> ThreadLog:
        """Take the thread's lock (``ThreadLocked`` at once if held elsewhere) and load it."""
        key = thread_key(thread_id)
        directory = self.run_directory
        lock_name = key + _LOCK_SUFFIX
        directory.refuse_symlink(lock_name)
        lock_fd = directory.lock(lock_name, thread_id)  # ours, regular, never blocking
        if lock_fd is None:
            raise ThreadLocked(thread_id=thread_id, path=directory.path(lock_name))
        handle = ThreadLog(self, key, lock_fd, thread_id=thread_id)
        try:
            directory.remove_temp_files(key)
            header = self._read_header(key, thread_id)
            if header is None:
                directory.remove_generations(key, ".log", keep=-1)
                directory.remove_generations(key, WRITES_SUFFIX, keep=-1, missing_ok=True)
                return handle
            name = log_name(key, header.generation)
            data = directory.read_trusted(name, key)
            if data is None:
                raise self._missing_log(name, thread_id)
            index, valid = replay(data, path=directory.path(name))
            if valid < len(data):
                cut_tail(handle.claim, name, valid)
            writes_valid = 0
            if header.format >= SPLIT_FORMAT:
                wname = writes_log_name(key, header.generation)
                wdata = directory.read_trusted(wname, key)
                if wdata is None:
                    raise self._missing_log(wname, thread_id)
                writes_valid = replay_writes(index, wdata, path=directory.path(wname))
                if writes_valid < len(wdata):
                    cut_tail(handle.claim, wname, writes_valid)
            directory.remove_generations(key, ".log", keep=header.generation)
            directory.remove_generations(
                key, WRITES_SUFFIX, keep=header.generation, missing_ok=True
            )
            handle.adopt_index(
                index,
                generation=header.generation,
                log_size=valid,
                split=header.format >= SPLIT_FORMAT,
                writes_size=writes_valid,
            )
        except BaseException:
            handle.close_sync()
            raise
        return handle

    def read_index(self, thread_id: str) -> Index | None:
        """The thread as its files say now, without its lock (None when there is no thread)."""
        key = thread_key(thread_id)
        directory = self.run_directory
        for _ in range(8):
            header = self._read_header(key, thread_id)
            if header is None:
                return None
            name = log_name(key, header.generation)
            data = directory.read_trusted(name, key)
            wdata: bytes | None = b""
            wname = ""
            if header.format >= SPLIT_FORMAT:
                wname = writes_log_name(key, header.generation)
                wdata = directory.read_trusted(wname, key)
            again = self._read_header(key, thread_id)
            if again is not None and again.generation == header.generation:
                if data is None:
                    raise self._missing_log(name, thread_id)
                if wdata is None:
                    raise self._missing_log(wname, thread_id)
                index = replay(data, path=directory.path(name))[0]
                if wdata:
                    replay_writes(index, wdata, path=directory.path(wname))
                return index
        raise SaveFailed(
            run_id=thread_id,
            path=directory.path(key + _HEADER_SUFFIX),
            reason="the thread was rewritten eight times while being read; try again",
        )

    def thread_ids(self) -> list[str]:
        """The ID of every thread in the directory, sorted."""
        if not self.directory.exists() and not self.directory.is_symlink():
            return []
        found = []
        for name in self.fs.listdir(self.run_directory.fd()):
            if name.endswith(_HEADER_SUFFIX) and not name.startswith("."):
                header = self._read_header(name[: -len(_HEADER_SUFFIX)], None)
                if header is not None:
                    found.append(header.thread_id)
        return sorted(found)

    def _missing_log(self, name: str, thread_id: str) -> CheckpointCorrupt:
        # A header is replaced only after the log it names is written, flushed and
        # its name synced, and is removed before its log: a missing log was deleted.
        return CheckpointCorrupt(
            path=self.run_directory.path(name),
            reason=f"the header of thread {thread_id!r} names this log and it is missing "
            "(deleted, or the header was altered)",
        )

    def _read_header(self, key: str, thread_id: str | None) -> Header | None:
        name = key + _HEADER_SUFFIX
        path = self.run_directory.path(name)
        # As the stores read theirs: O_NONBLOCK (a FIFO here is refused, not waited on),
        # and only a regular file this user owns and nobody else can write (issue 31).
        data = self.run_directory.read_trusted(name, thread_id or key)
        if data is None:
            return None
        try:
            header = HEADER_DECODER.decode(data)
        except msgspec.DecodeError as exc:
            raise CheckpointCorrupt(
                path=path, reason=f"torn or not a thread header ({exc})"
            ) from exc
        if header.format not in (1, 2, FORMAT):
            raise CheckpointCorrupt(path=path, reason=f"unknown thread format {header.format}")
        if header.format >= 2 and header.crc != header_crc(
            header.format, header.thread_id, header.generation
        ):
            raise CheckpointCorrupt(path=path, reason="the header's checksum does not match")
        if thread_id is not None and header.thread_id != thread_id:
            raise CheckpointCorrupt(
                path=path, reason=f"it holds thread {header.thread_id!r}, not {thread_id!r}"
            )
        return header


class ThreadLog:
    """Ownership of one thread: its claim (the lock), its two framed logs and its index."""

    def __init__(self, store: ThreadStore, key: str, lock_fd: int, *, thread_id: str) -> None:
        self._threads = store
        self._key = key
        self.claim = Claim(store.run_directory, key, lock_fd)
        """The thread's lock as this handle holds it: checks before each write, errors."""
        self.thread_id = thread_id
        self._generation = 0
        self._index = Index()
        self._flushed: deque[Writes] = deque()
        """Writes records flushed without the saver's lock, not yet applied to the index."""
        self.exists = False
        self.split = False
        """True when pending writes go to the writes log (a format 3 thread)."""
        self.previous: dict[tuple[str, str], tuple[Node, list[Any]]] = {}
        """(namespace, channel) -> the tip node and its value as a list, for appends."""
        self._main, self._writes = self._new_logs(0)
        self.flushing = threading.Lock()
        """Held by a put_writes from before it reads the writes log's end until its append is
        durable and queued, which it may make without the saver's lock (see the saver); a
        plain lock because releasing one costs less than setting an ``Event``."""

    def _new_logs(
        self, generation: int, *, sizes: tuple[int, int] = (0, 0)
    ) -> tuple[FramedLog, FramedLog]:
        """The main and writes logs of ``generation``, not open yet."""
        return (
            FramedLog(self.claim, log_name(self._key, generation), size=sizes[0]),
            FramedLog(self.claim, writes_log_name(self._key, generation), size=sizes[1]),
        )

    @property
    def index(self) -> Index:
        """The thread's index, with every flushed writes record applied (under the saver's lock)."""
        while self._flushed:
            self._index.apply_writes(self._flushed.popleft())
        return self._index

    @index.setter
    def index(self, index: Index) -> None:
        self._flushed.clear()
        self._index = index

    def flushed(self, record: Writes) -> None:
        """A writes record is durable in the writes log: queue it for the index, let go of it."""
        self._flushed.append(record)
        self.flushing.release()

    def break_off(self, reason: str) -> None:
        """An unlocked append failed: no more appends through this handle; let go of it."""
        self.claim.broken = self.claim.broken or reason
        self.flushing.release()

    def wait_idle(self) -> None:
        """Wait until no put_writes holds the writes log (see :attr:`flushing`)."""
        with self.flushing:
            pass

    def adopt_index(
        self, index: Index, *, generation: int, log_size: int, split: bool, writes_size: int
    ) -> None:
        """Take what a claim's load found as what the disk holds (called by the store)."""
        self.index = index
        self._generation = generation
        self._main, self._writes = self._new_logs(generation, sizes=(log_size, writes_size))
        self.split = split
        self.exists = True

    @property
    def writes_log_open(self) -> bool:
        """True when the writes log is open (it is opened by the first append after a claim)."""
        return self._writes.fd is not None

    def _append_to(self, log_file: FramedLog, record: bytes) -> None:
        """Append to one of this generation's logs, creating the main log with its first record.

        A run's journal log is made by compaction with a header record (and its
        generation checked against the snapshot's); a thread's log is made by its
        first append, and its header file names the generation, so this keeps the
        thread's own protocol rather than the run journal's.
        """
        if log_file.fd is None:  # the writes log is made by the rewrite that makes the log
            new_log = log_file is self._main and log_file.size == 0
            self._open_log(log_file, new_log=new_log, name_unsynced=new_log)
        log_file.append(record)

    def append_writes_unlocked(self, record: bytes) -> None:
        """Append a framed ``Writes`` record to the open writes log: reserve, write, flush.

        Called without the saver's lock (holding :attr:`flushing` keeps everyone
        else off this log and off closing the handle): it touches only the writes log's
        descriptor and bookkeeping, no directory and no shared state. A failed
        system call is raised as the ``OSError``; the caller breaks the handle
        under the saver's lock (:meth:`writes_failed`).
        """
        if self._writes.fd is None:
            raise RuntimeError("the writes log is not open")  # the saver opens it under its lock
        self._writes.append(record, translate=False)

    def writes_failed(self, exc: OSError) -> Exception:
        """The error for a failed unlocked append; breaks the handle (call under the lock)."""
        return self.claim.failed(exc, self._writes.name, True)

    def _open_log(self, log_file: FramedLog, *, new_log: bool, name_unsynced: bool) -> None:
        """Open one of the logs for appending (``new_log``: create it), as the append path wants.

        When syncing on Linux, with ``O_DSYNC`` (``framedlog.DSYNC``): each ``write``
        returns once the record and the size it reaches are durable, as ``write`` +
        ``fdatasync`` would, in one system call (and one release of the GIL, not two:
        each release lets a busy thread in, and getting the GIL back can take until
        that thread blocks or the switch interval forces it out).
        """
        claim, store = self.claim, self._threads
        fs, dir_fd, name = store.fs, claim.directory.fd(), log_file.name
        flags = os.O_WRONLY | _NOFOLLOW | log_file.flags()
        if new_log:
            flags |= os.O_CREAT | os.O_EXCL
        try:
            fd = claim.step(lambda: fs.open(name, flags, 0o600, dir_fd=dir_fd), name)
        except Exception:
            if not new_log:
                raise
            # A log of this generation left by a process that died before its first
            # append was flushed holds nothing that was ever acknowledged.
            fs.unlink(name, dir_fd=dir_fd)
            fd = claim.step(lambda: fs.open(name, flags, 0o600, dir_fd=dir_fd), name)
        # The claim cut any tail after the last whole record: the end is where to write.
        log_file.attach(fd, name_unsynced=name_unsynced)

    def _close_logs(self) -> None:
        self._main.close()
        self._writes.close()

    def close_sync(self) -> None:
        """Give back unused reserved space, then release the logs and the lock."""
        self._main.give_back()
        self._writes.give_back()
        self._close_logs()
        self.claim.release()

    def append(
        self, record: Record, *, lists: dict[tuple[str, str], list[Any] | None] | None = None
    ) -> None:
        """Apply one record to the index, then make it durable at the end of its log.

        A ``Writes`` record of a format 3 thread goes to the writes log, numbered
        in that log's own sequence (``record.seq`` is replaced). ``lists`` maps
        (namespace, channel) to the value a ``Put`` stores for it when that is a
        list (else None): :attr:`previous` then holds it, for the next ``Put``.

        The index and ``previous`` change before the write, so that the write is
        the last thing an append waits for: after it, only the log's end is
        noted. Should the write fail, the saver drops this handle (and its
        index), and the next claim reads what the disk holds.
        """
        self.claim.check_usable()
        if not self.exists:
            self.rewrite([msgspec.structs.replace(record, seq=1)])
            self._remember_lists(lists)
            return
        index = self.index
        if self.split and isinstance(record, Writes):
            record = msgspec.structs.replace(record, seq=index.wseq + 1)
            framed = frame(record)
            index.apply_writes(record)
            self._append_to(self._writes, framed)
            return
        framed = frame(record)  # before apply, which moves a Put's blobs into the index
        index.apply(record)
        self._remember_lists(lists)
        self._append_to(self._main, framed)

    def _remember_lists(self, lists: dict[tuple[str, str], list[Any] | None] | None) -> None:
        if not lists:
            return
        tips, previous = self.index.tips, self.previous
        for key, listed in lists.items():
            tip = tips.get(key)
            if listed is not None and tip is not None:
                previous[key] = (tip, listed)
            else:
                previous.pop(key, None)

    def rewrite(self, records: list[Record]) -> None:
        """Replace the thread's log by ``records`` (seqs from 1), crash-atomically."""
        claim = self.claim
        claim.check_usable()
        fs = self._threads.fs
        old = self._generation
        self._close_logs()
        self._generation = old + 1
        self._main, self._writes = self._new_logs(self._generation)
        try:
            # The writes log is made empty first: the directory sync of the log's
            # first append then makes both names durable before the header names them.
            self._open_log(self._writes, new_log=True, name_unsynced=False)
            self._append_to(self._main, b"".join(frame(record) for record in records))
            faults.point("langgraph.rewrite.log_synced")
            claim.replace(self._key + _HEADER_SUFFIX, header(self.thread_id, old + 1))
        except BaseException as exc:
            # The header on disk may name either generation now: this handle must not
            # append again. The saver drops it; a new claim reads what the disk says.
            claim.broken = f"a rewrite failed ({exc.__class__.__name__})"
            raise
        if old:
            dir_fd = claim.directory.fd()
            for stale in (log_name(self._key, old), writes_log_name(self._key, old)):
                with suppress(FileNotFoundError):
                    fs.unlink(stale, dir_fd=dir_fd)
        faults.point("langgraph.rewrite.done")
        index = Index()
        for record in records:
            index.apply(record)
        self.index = index
        self.exists = True
        self.split = True
        self.previous.clear()

    def delete(self) -> None:
        """Remove the thread: its header first (durably), then its logs. The lock stays."""
        claim = self.claim
        claim.check_usable()
        directory, fs = claim.directory, self._threads.fs
        dir_fd = directory.fd()
        name = self._key + _HEADER_SUFFIX
        self._close_logs()
        with suppress(FileNotFoundError):
            claim.step(lambda: fs.unlink(name, dir_fd=dir_fd), name)
        if directory.sync:
            claim.step(lambda: fs.fsync(dir_fd), str(directory.directory), fatal=True)
        faults.point("langgraph.delete.header_removed")
        directory.remove_generations(self._key, ".log", keep=-1)
        directory.remove_generations(self._key, WRITES_SUFFIX, keep=-1, missing_ok=True)
        self.index = Index()
        self.exists = False
        self.split = False
        self.previous.clear()
        self._generation = 0
        self._main, self._writes = self._new_logs(0)
