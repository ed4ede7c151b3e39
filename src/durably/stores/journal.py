"""The journal store: one append and one flush per save, bytes in proportion to the change.

Per run, in the state directory (0700)::

    <run>.json         a snapshot in the checksummed envelope, naming its log generation G
    <run>.<G>.log      records appended since that snapshot (0600)
    <run>.lock         flock'ed by the owner; never deleted

A save that only appended messages and changed a few fields appends one record
holding just that change: one ``write`` and one ``fdatasync``. A record is

    magic (4 bytes) | length (4, little-endian) | CRC-32 of length and payload (4) | payload

where the payload is JSON: ``{"seq": n, "add": [messages...], "set": {field: value}}``.
When history is rewritten (the context policy's summary) or the log grows past
a multiple of the snapshot, the store compacts: a new snapshot naming
generation G+1, written with the crash-atomic protocol; only after its directory
sync is the old log removed.

Recovery: load the snapshot, replay its generation's log. A torn tail (a record
that never finished its flush: short, or failing its checksum with nothing valid
after it) is cut off; a bad record with a valid record after it is
``CheckpointCorrupt``, never skipped. The first record of a new log also syncs
the directory, so the log's name survives a power cut with its data.
"""

from __future__ import annotations

import os
import struct
import zlib
from contextlib import suppress

import msgspec

from .. import faults
from .._sysio import FileSystem
from ..errors import CheckpointCorrupt
from ..state import Message, RunState, utcnow
from ._envelope import seal
from .file import FileRun, FileStore

__all__ = ["JournalRun", "JournalStore"]

_MAGIC = b"\xd7DJr"
_HEADER = struct.Struct("<4sII")
_LENGTH = struct.Struct("<I")
_NOFOLLOW = os.O_NOFOLLOW


class _Record(msgspec.Struct, kw_only=True, omit_defaults=True):
    seq: int
    add: list[Message] = []
    set: dict[str, msgspec.Raw] = {}


_record_encoder = msgspec.json.Encoder()
_record_decoder = msgspec.json.Decoder(_Record)
_field_encoder = msgspec.json.Encoder()
_FIELDS = {
    f.name: msgspec.json.Decoder(f.type)
    for f in msgspec.structs.fields(RunState)
    if f.name != "messages"
}


def _frame(payload: bytes) -> bytes:
    length = _LENGTH.pack(len(payload))
    return _HEADER.pack(_MAGIC, len(payload), zlib.crc32(length + payload)) + payload


def _unframe(data: bytes, offset: int) -> tuple[bytes, int] | None:
    """The payload at ``offset`` and the offset after it, or None when it is not a whole record."""
    if offset + _HEADER.size > len(data):
        return None
    magic, length, crc = _HEADER.unpack_from(data, offset)
    end = offset + _HEADER.size + length
    if magic != _MAGIC or end > len(data):
        return None
    payload = data[offset + _HEADER.size : end]
    if zlib.crc32(_LENGTH.pack(length) + payload) != crc:
        return None
    return payload, end


def _encode_fields(state: RunState) -> dict[str, bytes]:
    return {name: _field_encoder.encode(getattr(state, name)) for name in _FIELDS}


def _log_name(run_id: str, generation: int) -> str:
    return f"{run_id}.{generation}.log"


class JournalStore(FileStore):
    """Runs as a snapshot plus an append-only log of changes (see the module docstring).

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
        self.compact_ratio = compact_ratio
        self.compact_min_bytes = compact_min_bytes

    def _new_handle(self, run_id: str, lock_fd: int) -> JournalRun:
        return JournalRun(self, run_id, lock_fd)

    def _load(self, run_id: str, dir_fd: int, *, owner: FileRun | None = None) -> RunState:
        state, generation, snapshot_size = self._read_snapshot(run_id, dir_fd)
        if generation == 0:  # a snapshot-store run: nothing to replay
            if isinstance(owner, JournalRun):
                owner._adopt(state, generation=0, log_size=0, snapshot_size=snapshot_size, seq=0)
            return state
        name = _log_name(run_id, generation)
        data = self._read_log(name, dir_fd)
        seq, valid = self._replay(state, data, path=self._path(name))
        if isinstance(owner, JournalRun):
            if valid < len(data):
                owner._cut_tail(name, valid)  # a torn tail that never finished its flush
            self._remove_stale_logs(run_id, generation, dir_fd)
            owner._adopt(
                state, generation=generation, log_size=valid, snapshot_size=snapshot_size, seq=seq
            )
        return state

    def _read_log(self, name: str, dir_fd: int) -> bytes:
        try:
            fd = self.fs.open(name, os.O_RDONLY | _NOFOLLOW, 0, dir_fd=dir_fd)
        except FileNotFoundError:
            return b""  # compacted and no change appended since
        except OSError as exc:
            raise self._translate(exc, name, name) from exc
        try:
            return self.fs.read(fd)
        finally:
            self.fs.close(fd)

    def _replay(self, state: RunState, data: bytes, *, path: str) -> tuple[int, int]:
        """Apply the log's valid records to ``state``; return (last seq, valid byte length)."""
        offset, seq = 0, 0
        while offset < len(data):
            framed = _unframe(data, offset)
            if framed is None:
                if _valid_record_after(data, offset + 1):
                    raise CheckpointCorrupt(
                        path=path, reason=f"a damaged record at byte {offset} with records after it"
                    )
                return seq, offset  # torn tail
            payload, end = framed
            try:
                record = _record_decoder.decode(payload)
            except msgspec.DecodeError as exc:
                raise CheckpointCorrupt(
                    path=path, reason=f"record at byte {offset}: {exc}"
                ) from exc
            if record.seq != seq + 1:
                raise CheckpointCorrupt(
                    path=path, reason=f"record {record.seq} at byte {offset} follows {seq}"
                )
            state.messages.extend(record.add)
            for name, raw in record.set.items():
                decoder = _FIELDS.get(name)
                if decoder is None:
                    raise CheckpointCorrupt(path=path, reason=f"record {record.seq} sets {name!r}")
                try:
                    setattr(state, name, decoder.decode(raw))
                except msgspec.DecodeError as exc:
                    raise CheckpointCorrupt(
                        path=path, reason=f"record {record.seq}, field {name}: {exc}"
                    ) from exc
            seq, offset = record.seq, end
        return seq, offset

    def _remove_stale_logs(self, run_id: str, generation: int, dir_fd: int) -> None:
        keep = _log_name(run_id, generation)
        for name in self.fs.listdir(dir_fd):
            if name.startswith(f"{run_id}.") and name.endswith(".log") and name != keep:
                middle = name[len(run_id) + 1 : -len(".log")]
                if middle.isdigit():
                    self.fs.unlink(name, dir_fd=dir_fd)


def _valid_record_after(data: bytes, start: int) -> bool:
    position = data.find(_MAGIC, start)
    while position != -1:
        if _unframe(data, position) is not None:
            return True
        position = data.find(_MAGIC, position + 1)
    return False


class JournalRun(FileRun):
    """Ownership of one run in a :class:`JournalStore`."""

    def __init__(self, store: JournalStore, run_id: str, lock_fd: int) -> None:
        super().__init__(store, run_id, lock_fd)
        self._journal = store
        self._generation = 0
        self._seq = 0
        self._log_fd: int | None = None
        self._log_size = 0
        self._snapshot_size = 0
        self._fields: dict[str, bytes] = {}
        self._saved_messages = 0
        self._last_message: Message | None = None
        self._summarized = 0
        self._fresh = True

    def _adopt(
        self, state: RunState, *, generation: int, log_size: int, snapshot_size: int, seq: int
    ) -> None:
        self._generation, self._log_size, self._seq = generation, log_size, seq
        self._snapshot_size = snapshot_size
        self._remember(state)
        self._fresh = generation == 0  # a snapshot-store run compacts into a journal first

    def _remember(self, state: RunState) -> None:
        self._fields = _encode_fields(state)
        self._saved_messages = len(state.messages)
        self._last_message = state.messages[-1] if state.messages else None
        self._summarized = state.summarized

    def close_sync(self) -> None:
        """Release the lock and the log descriptor."""
        if self._log_fd is not None:
            self._store.fs.close(self._log_fd)
            self._log_fd = None
        super().close_sync()

    def save_sync(self, state: RunState) -> None:
        """Append the change since the last save, or compact when that is due."""
        self._check_usable()
        state.saved_at = utcnow()
        if self._fresh or self._rewritten(state) or self._log_due():
            self._compact(state)
            return
        added = state.messages[self._saved_messages :]
        fields = _encode_fields(state)
        changed = {
            name: msgspec.Raw(value)
            for name, value in fields.items()
            if self._fields.get(name) != value
        }
        payload = _record_encoder.encode(_Record(seq=self._seq + 1, add=added, set=changed))
        self._append(_frame(payload))
        self._seq += 1
        self._fields = fields
        self._saved_messages = len(state.messages)
        self._last_message = state.messages[-1] if state.messages else None

    def _rewritten(self, state: RunState) -> bool:
        """True when the messages saved so far are no longer a prefix of ``state.messages``."""
        if state.summarized != self._summarized or len(state.messages) < self._saved_messages:
            return True
        if self._saved_messages == 0:
            return False
        return state.messages[self._saved_messages - 1] != self._last_message

    def _log_due(self) -> bool:
        store = self._journal
        return (
            self._log_size > store.compact_min_bytes
            and self._log_size > store.compact_ratio * self._snapshot_size
        )

    def _append(self, record: bytes) -> None:
        store, fs = self._journal, self._journal.fs
        name = _log_name(self._run_id, self._generation)
        dir_fd = store._directory_fd()
        new_log = self._log_fd is None and self._log_size == 0
        if self._log_fd is None:
            flags = os.O_WRONLY | _NOFOLLOW | (os.O_CREAT | os.O_EXCL if new_log else 0)
            try:
                self._log_fd = self._step(lambda: fs.open(name, flags, 0o600, dir_fd=dir_fd), name)
            except Exception:
                if not new_log:
                    raise
                # A log of this generation left by a process that died before its first
                # append was flushed holds nothing that was ever acknowledged.
                fs.unlink(name, dir_fd=dir_fd)
                self._log_fd = self._step(lambda: fs.open(name, flags, 0o600, dir_fd=dir_fd), name)
            fs.seek_end(self._log_fd)
        fd = self._log_fd
        self._step(lambda: fs.write(fd, record), name)
        faults.point("store.append.written")
        if store.sync:
            self._step(lambda: fs.datasync(fd), name, fatal=True)
            if new_log:  # the log's directory entry must survive with its first record
                self._step(lambda: fs.fsync(dir_fd), str(store.directory), fatal=True)
        self._log_size += len(record)
        faults.point("store.append.synced")

    def _compact(self, state: RunState) -> None:
        store, fs = self._journal, self._journal.fs
        old = self._generation
        generation = old + 1
        data = seal(state, journal=generation)
        self._write_snapshot(data)  # crash-atomic; ends with the directory sync
        if self._log_fd is not None:
            fs.close(self._log_fd)
            self._log_fd = None
        if old:
            # Only now, after the new snapshot's directory sync: removing the old log
            # earlier could lose acknowledged saves if the rename were undone.
            with suppress(FileNotFoundError):
                fs.unlink(_log_name(self._run_id, old), dir_fd=store._directory_fd())
        faults.point("store.compact.done")
        self._generation, self._seq, self._log_size = generation, 0, 0
        self._snapshot_size = len(data)
        self._fresh = False
        self._remember(state)

    def _cut_tail(self, name: str, size: int) -> None:
        store, fs = self._journal, self._journal.fs
        dir_fd = store._directory_fd()
        fd = self._step(lambda: fs.open(name, os.O_WRONLY | _NOFOLLOW, 0o600, dir_fd=dir_fd), name)
        try:
            fs.truncate(fd, size)
            if store.sync:
                fs.datasync(fd)
        finally:
            fs.close(fd)
