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
import stat
import sys
from pathlib import Path

__all__ = ["FileSystem", "filesystem_type", "fsync_fd"]

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
