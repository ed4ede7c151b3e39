"""A directory tree held in memory and written back byte for byte.

The sweep keeps the disk a killed process left behind and lays it down again
for each second crash that follows it; the triage job keeps its fresh world
the same way. Regular files, directories and symbolic links are kept, with
their modes and modification times; anything else (a socket, a FIFO), or more
than :data:`MAX_BYTES` of files, cannot be copied and raises :class:`Uncopyable`.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Tree", "Uncopyable"]


MAX_BYTES = 256 * 1024 * 1024
"""The most a tree may hold: it is kept in memory, once per worker."""


class Uncopyable(Exception):
    """The tree holds something other than files, directories and links."""


@dataclass(frozen=True, slots=True)
class _Entry:
    path: str
    """Relative to the tree's root; parents come before their children."""
    mode: int
    mtime_ns: int
    contents: bytes | None = None
    """A file's bytes; None for a directory or a link."""
    link: str | None = None


@dataclass(frozen=True, slots=True)
class Tree:
    """Everything under a directory, as it was when read."""

    entries: tuple[_Entry, ...]

    @classmethod
    def read(cls, root: Path, *, max_bytes: int = MAX_BYTES) -> Tree:
        """Read everything under ``root`` (which itself is not part of the tree).

        Raises:
            Uncopyable: something under it is not a file, directory or link, or
                its files hold more than ``max_bytes`` in all.
        """
        entries: list[_Entry] = []
        size = 0
        pending = [""]
        while pending:
            relative = pending.pop()
            with os.scandir(os.path.join(root, relative)) as scan:
                children = sorted(scan, key=lambda e: e.name)
            for child in children:
                path = os.path.join(relative, child.name)
                info = child.stat(follow_symlinks=False)
                if stat.S_ISLNK(info.st_mode):
                    link = os.readlink(child.path)
                    entries.append(_Entry(path, 0, info.st_mtime_ns, link=link))
                elif stat.S_ISDIR(info.st_mode):
                    entries.append(_Entry(path, stat.S_IMODE(info.st_mode), info.st_mtime_ns))
                    pending.append(path)
                elif stat.S_ISREG(info.st_mode):
                    size += info.st_size
                    if size > max_bytes:
                        raise Uncopyable(f"{root} holds more than {max_bytes} bytes")
                    contents = _read_file(child.path, info.st_size)
                    mode = stat.S_IMODE(info.st_mode)
                    entries.append(_Entry(path, mode, info.st_mtime_ns, contents=contents))
                else:
                    raise Uncopyable(f"{child.path} is neither a file, a directory nor a link")
        return cls(tuple(entries))

    def write(self, root: Path) -> None:
        """Make ``root`` hold exactly this tree: anything else under it is removed first."""
        if root.exists():
            if sys.version_info >= (3, 12):
                shutil.rmtree(root, onexc=_make_writable_and_retry)
            else:
                shutil.rmtree(root, onerror=_make_writable_and_retry)
        root.mkdir(parents=True)
        directories: list[_Entry] = []
        for entry in self.entries:
            path = os.path.join(root, entry.path)
            if entry.link is not None:
                os.symlink(entry.link, path)
                os.utime(path, ns=(entry.mtime_ns, entry.mtime_ns), follow_symlinks=False)
            elif entry.contents is None:
                os.mkdir(path, 0o700)
                directories.append(entry)
            else:
                _write_file(path, entry.contents, entry.mode, entry.mtime_ns)
        # Directories last and deepest first: filling one moves its time, and a
        # read-only one could not be filled.
        for entry in reversed(directories):
            path = os.path.join(root, entry.path)
            os.chmod(path, entry.mode)
            os.utime(path, ns=(entry.mtime_ns, entry.mtime_ns))


def _read_file(path: str, size: int) -> bytes:
    """A file's bytes (``size``: its size when listed; read on to its end whatever it is now).

    Plain descriptor calls: the sweep copies whole disks at every crash point, and a
    Python file object per file cost more than the reading.
    """
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        chunks = [os.read(descriptor, size + 1)]
        while chunks[-1]:
            chunks.append(os.read(descriptor, 1 << 16))
    finally:
        os.close(descriptor)
    return b"".join(chunks)


def _write_file(path: str, contents: bytes, mode: int, mtime_ns: int) -> None:
    """Create the file at ``path`` holding ``contents``, with ``mode`` and ``mtime_ns``."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        view = memoryview(contents)
        while view:
            view = view[os.write(descriptor, view) :]
        os.fchmod(descriptor, mode)
        os.utime(descriptor, ns=(mtime_ns, mtime_ns))
    finally:
        os.close(descriptor)


def _make_writable_and_retry(function: Callable[..., object], path: str, _: object) -> None:
    """Error hook of ``shutil.rmtree``: a read-only directory (kept) blocks removing its files."""
    parent = os.path.dirname(path)
    os.chmod(parent, stat.S_IMODE(os.stat(parent).st_mode) | stat.S_IRWXU)
    function(path)
