"""The listing index: a cache of run summaries beside the runs, never trusted over them.

Listing thousands of runs by loading each one costs the bytes of every run. The
file stores keep ``.durably-index`` in the state directory instead: per run, the
*identity* of its files (name, inode, size, modification and change time, mode,
owner of the snapshot, the logs and the lock) and an opaque summary record
(:mod:`durably.listing` decides what it holds). A lister stats the run files,
which is cheap, and loads only the runs whose identity differs from the one
recorded. So the index can only save work: an index that is missing, damaged
(it carries a CRC-32), of another format, not a regular file, owned by another
user or readable or writable by anyone else is ignored and rebuilt, never an
error.

A run's identity is taken *before* its state is read. A save landing between
the two changes the files after the identity was taken, so the next listing
sees another identity and reads the run again; the other order could pair an
old summary with the new identity for good.

Timestamps come from a coarse kernel clock (a tick, some milliseconds) and an
inode number can be reused, so a file rewritten within the same tick could in
principle show the same identity again. As git does with its "racily clean"
index entries, a run whose files changed less than :data:`SETTLE_NS` before the
listing started is not recorded: it is read again by every listing until it
has been quiet that long.
"""

from __future__ import annotations

import os
import stat
import time
import zlib
from typing import TYPE_CHECKING

import msgspec

from .._sysio import is_temp_name, logger, replace_file
from ..errors import DurablyError
from ._guard import open_trusted

if TYPE_CHECKING:
    from .file import FileStore

__all__ = ["INDEX_NAME", "SETTLE_NS", "Identity", "load", "save", "scan", "settled"]


INDEX_NAME = ".durably-index"
"""Starts with a dot: never taken for a run, and its temp files (``..durably-index.<hex>.tmp``)
never for a run's temp files (a run ID starts with a letter or a digit)."""

SETTLE_NS = 2_000_000_000
"""How long a run's files must have been still before its summary is recorded."""

_FORMAT = 1
_MAGIC = b"durably-index"
_STALE_TEMP_NS = 60_000_000_000
"""A lister killed mid-write leaves its temp; the next writer removes temps older than this."""

FileIdentity = tuple[str, int, int, int, int, int, int]
"""Name, inode, size, mtime_ns, ctime_ns, st_mode, st_uid of one of a run's files."""

Identity = tuple[FileIdentity, ...]
"""Every file of a run, sorted by name."""


class _Entry(msgspec.Struct, array_like=True):
    run: str
    files: list[FileIdentity]
    summary: msgspec.Raw


class _Index(msgspec.Struct, kw_only=True):
    format: int
    entries: list[_Entry]


_decoder = msgspec.json.Decoder(_Index)
_encoder = msgspec.json.Encoder()


def _run_of(name: str) -> str | None:
    """The run a file in the state directory belongs to, or None (temps, the index, others)."""
    if name.startswith("."):
        return None
    if name.endswith(".json"):
        return name[: -len(".json")]
    if name.endswith(".lock"):
        return name[: -len(".lock")]
    if name.endswith(".log"):
        # <run>.<generation>.log, exactly as the journal store names its logs.
        run, _, generation = name[: -len(".log")].rpartition(".")
        return run if run and generation.isdigit() else None
    return None


def scan(store: FileStore) -> dict[str, Identity]:
    """Every run with a snapshot in ``store``'s directory, and the identity of its files.

    One directory listing and one ``lstat`` per file; nothing is opened. The
    directory is the store's (checked as the user's own when it is opened).
    """
    dir_fd = store.run_directory.fd()
    names: dict[str, list[str]] = {}
    for name in store.fs.listdir(dir_fd):
        run = _run_of(name)
        if run is not None:
            names.setdefault(run, []).append(name)
    found: dict[str, Identity] = {}
    for run, files in names.items():
        if run + ".json" not in files:
            continue  # a lock or a log without a snapshot is not a run (yet)
        identity = []
        for name in sorted(files):
            try:
                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed since the listing (a compaction's old log)
            identity.append(
                (
                    name,
                    info.st_ino,
                    info.st_size,
                    info.st_mtime_ns,
                    info.st_ctime_ns,
                    info.st_mode,
                    info.st_uid,
                )
            )
        found[run] = tuple(identity)
    return found


def settled(identity: Identity, *, started_ns: int) -> bool:
    """Whether a summary read after ``identity`` was taken may be recorded under it.

    Only regular files whose content (``mtime``) has been still for :data:`SETTLE_NS`
    before the listing started (``started_ns``, from ``time.time_ns()``) qualify;
    anything else (a symlink, a FIFO, a run being saved now) is read by every listing.
    """
    return all(
        stat.S_ISREG(mode) and mtime < started_ns - SETTLE_NS
        for _, _, _, mtime, _, mode, _ in identity
    )


def load(store: FileStore) -> dict[str, tuple[Identity, msgspec.Raw]]:
    """The index's entries, or nothing when it is missing, damaged, foreign or not private."""
    path = str(store.directory / INDEX_NAME)
    try:
        dir_fd = store.run_directory.fd()
        fd = open_trusted(store.fs, INDEX_NAME, os.O_RDONLY, 0, dir_fd=dir_fd, path=path)
    except FileNotFoundError:
        return {}
    except (OSError, DurablyError) as exc:
        logger("durably.stores").info("ignoring the listing index %s: %s", path, exc)
        return {}
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) & 0o077:
            logger("durably.stores").info("ignoring the listing index %s: others may read it", path)
            return {}
        data = store.fs.read(fd)
    except OSError as exc:
        logger("durably.stores").info("ignoring the listing index %s: %s", path, exc)
        return {}
    finally:
        store.fs.close(fd)
    header, _, body = data.partition(b"\n")
    parts = header.split(b" ")
    try:
        good = (
            len(parts) == 3
            and parts[0] == _MAGIC
            and int(parts[1]) == _FORMAT
            and int(parts[2], 16) == zlib.crc32(body)
        )
        index = _decoder.decode(body) if good else None
    except (ValueError, msgspec.DecodeError, RecursionError):
        index = None
    if index is None or index.format != _FORMAT:
        logger("durably.stores").info(
            "ignoring the listing index %s: damaged or of another format", path
        )
        return {}
    return {
        entry.run: (tuple(tuple(f) for f in entry.files), entry.summary)  # type: ignore[misc]
        for entry in index.entries
    }


def save(store: FileStore, entries: dict[str, tuple[Identity, bytes]]) -> None:
    """Replace the index crash-atomically; a failure only costs the next listing its time.

    Not synced: after a power cut the index is the old one, the new one, or
    damaged (its CRC then fails and it is rebuilt); a stale identity never
    matches a run's files, so no state of the index can change a listing.
    """
    body = _encoder.encode(
        _Index(
            format=_FORMAT,
            entries=[
                _Entry(run=run, files=list(identity), summary=msgspec.Raw(summary))
                for run, (identity, summary) in sorted(entries.items())
            ],
        )
    )
    header = b"%s %d %08x\n" % (_MAGIC, _FORMAT, zlib.crc32(body))
    try:
        dir_fd = store.run_directory.fd()
        _remove_stale_temps(store, dir_fd)
        replace_file(store.fs, dir_fd, INDEX_NAME, header + body, mode=0o600, sync=False)
    except (OSError, DurablyError) as exc:
        logger("durably.stores").info(
            "could not write the listing index in %s: %s", store.directory, exc
        )


def _remove_stale_temps(store: FileStore, dir_fd: int) -> None:
    """Remove index temps a killed lister left (old ones only: another may be writing)."""
    now = time.time_ns()
    for name in store.fs.listdir(dir_fd):
        if not is_temp_name(name, INDEX_NAME):
            continue
        info = store.fs.lstat(name, dir_fd=dir_fd)
        if info is not None and now - info.st_mtime_ns > _STALE_TEMP_NS:
            try:
                store.fs.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                continue
