"""The blocking system calls durably's stores make, behind one small seam.

Stores never call ``os`` directly for the files they own: they go through a
:class:`FileSystem`, so tests can fail a chosen operation (EIO, ENOSPC), record
the order of calls, or model a power cut (data not yet synced lost or torn).
Every path is relative to a directory descriptor and opened with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import logging

__all__ = [
    "FileSystem",
    "append_line",
    "filesystem_type",
    "fsync_fd",
    "is_temp_name",
    "logger",
    "read_file",
    "replace_file",
    "temp_name",
    "write_file",
]


def logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)``, importing logging when first needed.

    The stores log only on rare paths (a temp file left behind), and importing
    logging is a visible part of a command's start-up (benchmarks/startup.py).
    """
    import logging

    return logging.getLogger(name)


_T = TypeVar("_T")
_TEMP_HEX = 16
"""Hex digits of randomness in a temp file's name (8 random bytes)."""
TEMP_TAIL = 1 + _TEMP_HEX + 4
"""Characters after a temp name's stem: ``.<16 hex>.tmp``."""

_NETWORK_FS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "afs", "ceph", "fuse.sshfs"})


def fsync_fd(fd: int) -> None:
    """Flush a descriptor to stable storage.

    On macOS ``fsync`` leaves data in the drive's cache; ``F_FULLFSYNC`` flushes it
    (Go's ``File.Sync`` does the same).
    """
    if sys.platform == "darwin":  # pragma: no cover - not run on Linux CI
        fcntl.fcntl(fd, fcntl.F_FULLFSYNC)  # type: ignore[attr-defined,unused-ignore]
    else:
        os.fsync(fd)


class FileSystem:
    """The real file system. Subclass and override one method to inject a fault."""

    def open_dir(self, path: str) -> int:
        """Open a directory for ``dir_fd``-relative calls, refusing a symlink."""
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)

    def mkdir(self, path: str, mode: int) -> None:
        """Create one directory."""
        os.mkdir(path, mode)

    def open_dir_at(self, name: str, *, dir_fd: int) -> int:
        """Open the directory ``name`` inside ``dir_fd``, refusing a symlink (``ELOOP``)."""
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.open(name, flags, dir_fd=dir_fd)

    def mkdir_at(self, name: str, mode: int, *, dir_fd: int) -> None:
        """Create the directory ``name`` inside ``dir_fd``."""
        os.mkdir(name, mode, dir_fd=dir_fd)

    def open(self, name: str, flags: int, mode: int, *, dir_fd: int) -> int:
        """Open ``name`` inside ``dir_fd``; the caller adds ``O_NOFOLLOW``."""
        return os.open(name, flags | os.O_CLOEXEC, mode, dir_fd=dir_fd)

    def write(self, fd: int, data: bytes) -> None:
        """Write all of ``data`` at the descriptor's offset."""
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]

    def read(self, fd: int) -> bytes:
        """Read a descriptor to its end."""
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)

    def fsync(self, fd: int) -> None:
        """Flush a file or directory descriptor to stable storage."""
        fsync_fd(fd)

    def datasync(self, fd: int) -> None:
        """Flush a file's data (and the size that reaches it) to stable storage.

        ``fdatasync`` skips metadata a later read does not need (times), which is
        all an append-only log needs. macOS has no cheaper flush than F_FULLFSYNC.
        """
        if sys.platform == "darwin":  # pragma: no cover - not run on Linux CI
            fsync_fd(fd)
        else:
            os.fdatasync(fd)

    def truncate(self, fd: int, size: int) -> None:
        """Cut a file to ``size`` bytes."""
        os.ftruncate(fd, size)

    def allocate(self, fd: int, offset: int, length: int) -> bool:
        """Reserve ``length`` bytes from ``offset``, growing the file; they read as zeros.

        Writing into reserved space and syncing it need not commit a change of the
        file's size or block map to the file system's journal. Returns False when
        this platform has no ``posix_fallocate``; failures (``ENOSPC``) raise.
        """
        allocate = getattr(os, "posix_fallocate", None)
        if allocate is None:  # pragma: no cover - macOS, not run on Linux CI
            return False
        allocate(fd, offset, length)
        return True

    def seek_end(self, fd: int) -> int:
        """Move a descriptor's offset to the end of its file; return that offset."""
        return os.lseek(fd, 0, os.SEEK_END)

    def rename(self, src: str, dst: str, *, dir_fd: int) -> None:
        """Atomically replace ``dst`` with ``src`` inside one directory."""
        os.rename(src, dst, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)

    def unlink(self, name: str, *, dir_fd: int) -> None:
        """Remove a directory entry."""
        os.unlink(name, dir_fd=dir_fd)

    def close(self, fd: int) -> None:
        """Close a descriptor."""
        os.close(fd)

    def lstat(self, name: str, *, dir_fd: int) -> os.stat_result | None:
        """Stat without following a symlink; None when nothing is there."""
        try:
            return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def listdir(self, dir_fd: int) -> list[str]:
        """Names in a directory."""
        return os.listdir(dir_fd)

    def lock(self, fd: int) -> bool:
        """Take an exclusive lock without waiting; False when another process holds it."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise
        return True


def temp_name(stem: str) -> str:
    """A fresh temp file name for replacing ``stem``: ``.<stem>.<16 hex>.tmp``.

    The owner of ``stem`` finds its own leftovers with :func:`is_temp_name`, and
    nothing else: the random part has a fixed length and alphabet, so the temp of
    another name that merely starts with ``stem.`` (run ``a.b`` for run ``a``)
    never matches.
    """
    # os.urandom is what secrets.token_hex reads, without importing secrets (and hmac).
    return f".{stem}.{os.urandom(_TEMP_HEX // 2).hex()}.tmp"


def is_temp_name(name: str, stem: str | None = None) -> bool:
    """True when ``name`` is a temp file :func:`temp_name` made (for ``stem``, if given)."""
    if stem is None:
        return _ANY_TEMP.fullmatch(name) is not None
    pattern = rf"\.{re.escape(stem)}\.[0-9a-f]{{{_TEMP_HEX}}}\.tmp"
    return re.fullmatch(pattern, name) is not None


_ANY_TEMP = re.compile(rf"\..+\.[0-9a-f]{{{_TEMP_HEX}}}\.tmp")


def _no_point(label: str) -> None:
    return None


def replace_file(  # noqa: PLR0913 - the one crash-atomic save; every caller's hooks are keyword-only
    fs: FileSystem,
    dir_fd: int,
    name: str,
    data: bytes,
    *,
    mode: int,
    sync: bool,
    point: Callable[[str], None] = _no_point,
    before_rename: Callable[[], None] | None = None,
    on_error: Callable[[OSError, str, bool], Exception] | None = None,
    directory: str = ".",
    stem: str | None = None,
) -> None:
    """Replace ``name`` in ``dir_fd`` with ``data``, crash-atomically: the one way durably does it.

    A temp file (:func:`temp_name`) is created beside it with ``O_CREAT|O_EXCL|
    O_NOFOLLOW`` and ``mode``, written, fsynced, renamed over ``name``, and the
    directory fsynced. At any instant the directory holds the old file or the new
    one (and perhaps the temp, which the owner removes when it next opens). Every
    call goes through ``fs``, so the power-loss model sees it.

    Args:
        fs: the system-call seam.
        dir_fd: the directory, opened with :meth:`FileSystem.open_dir` or ``open_dir_at``.
        name: the file's name in it.
        data: the new content.
        mode: the new file's permission bits.
        sync: fsync the file and the directory; off only where power loss does not matter.
        point: called with ``temp_written``, ``temp_synced``, ``renamed``, ``dir_synced``
            (the store names its crash points by them).
        before_rename: a last check before the rename (e.g. refuse a symlink at ``name``).
        on_error: turns a failed call's ``OSError`` (and the name it was about, and
            whether it was the directory's fsync, after which the directory
            descriptor must not be trusted) into the exception to raise.
        directory: the directory's name, for ``on_error``.
        stem: the temp file's stem (default ``name``): the name its owner looks for.
    """

    def step(action: Callable[[], _T], about: str, *, fatal: bool = False) -> _T:
        try:
            return action()
        except OSError as exc:
            if on_error is None:
                raise
            raise on_error(exc, about, fatal) from exc

    temp = temp_name(stem or name)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    fd = step(lambda: fs.open(temp, flags, mode, dir_fd=dir_fd), temp)
    renamed = False
    try:
        try:
            step(lambda: fs.write(fd, data), temp)
            point("temp_written")
            if sync:
                step(lambda: fs.fsync(fd), temp)
            point("temp_synced")
        finally:
            fs.close(fd)
        if before_rename is not None:
            before_rename()
        step(lambda: fs.rename(temp, name, dir_fd=dir_fd), name)
        renamed = True
        point("renamed")
        if sync:
            step(lambda: fs.fsync(dir_fd), directory, fatal=True)
        point("dir_synced")
    finally:
        if not renamed:
            try:
                fs.unlink(temp, dir_fd=dir_fd)
            except OSError:
                logger("durably.io").warning(
                    "could not remove %s; its owner removes it on its next open", temp
                )


def append_line(path: str | os.PathLike[str], line: bytes, *, mode: int = 0o600) -> None:
    """Append one line to a log file with one ``write``, never through a symlink.

    ``O_APPEND|O_NOFOLLOW``: a link planted at ``path`` is refused (``ELOOP``),
    not followed. One ``write`` of a short line lands whole or not at all when
    the process is killed (the page cache keeps what was written).
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    fd = os.open(path, flags, mode)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        FileSystem().write(fd, line)
    finally:
        os.close(fd)


def read_file(path: str | os.PathLike[str]) -> bytes:
    """Read a regular file, never through a symlink (``ELOOP``) and never blocking on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return FileSystem().read(fd)
    finally:
        os.close(fd)


def write_file(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o600) -> None:
    """Replace the file at ``path`` by :func:`replace_file`, refusing symlinks on the last step.

    For the files a world keeps beside a run (``checks.json``, ``recording.json``):
    a link planted at ``path`` is replaced, never written through.
    """
    target = Path(path)
    fs = FileSystem()
    dir_fd = fs.open_dir(str(target.parent))
    try:
        replace_file(fs, dir_fd, target.name, data, mode=mode, sync=True)
    finally:
        fs.close(dir_fd)


def is_regular(info: os.stat_result) -> bool:
    """True for a regular file (not a symlink, directory or device)."""
    return stat.S_ISREG(info.st_mode)


_types_by_device: dict[int, str | None] = {}


def filesystem_type(path: str | Path) -> str | None:
    """The type of the file system holding ``path`` (from /proc/self/mountinfo), if known.

    Remembered per device number: every file on one mounted file system has
    its device's number, so a store opened again (the crash sweep opens
    thousands) reads the mount table once.
    """
    try:
        device = os.stat(path).st_dev
    except OSError:
        return _read_filesystem_type(path)
    if device not in _types_by_device:
        _types_by_device[device] = _read_filesystem_type(path)
    return _types_by_device[device]


def _read_filesystem_type(path: str | Path) -> str | None:
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    best, best_type = "", None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        mount_point = fields[4].replace("\\040", " ")
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):
            best, best_type = mount_point, right.split()[0]
    return best_type


def is_network_fs(fs_type: str | None) -> bool:
    """True for file systems on which ``flock`` does not have its local meaning."""
    return fs_type is not None and fs_type in _NETWORK_FS
