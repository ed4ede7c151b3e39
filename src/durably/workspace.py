"""The workspace: the files a run writes, each recorded by its SHA-256.

Tools write through a :class:`Workspace`, never around it. A write is synced
(the file, and any directory it had to create) before it returns, so the result
save that records its hash never describes a file the disk could still lose. On
every resume the loop verifies the recorded hashes; a file changed behind the
run's back stops it with ``WorkspaceChanged`` rather than letting the model
reason about files its conversation does not describe.

Paths are relative to the workspace root. Absolute paths, ``..`` and symlinks
anywhere on the way are refused.
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path, PurePosixPath

from ._sysio import fsync_fd
from .errors import UnsafePath, WorkspaceChanged

__all__ = ["Workspace", "sha256_bytes"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def sha256_bytes(data: bytes | str) -> str:
    """Hex SHA-256 of bytes (or of text as UTF-8)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


class Workspace:
    """A directory a run writes into, with every write synced and recorded.

    Args:
        root: the workspace directory (created if missing).
        sync: fsync writes; turn off only in tests that do not model power loss.
    """

    def __init__(self, root: str | os.PathLike[str], *, sync: bool = True) -> None:
        self.root = Path(root)
        self.sync = sync
        self.root.mkdir(parents=True, exist_ok=True)
        self._written: dict[str, str] = {}

    def normalize(self, path: str) -> str:
        """The canonical relative form of ``path``; refuses anything that leaves the root."""
        pure = PurePosixPath(path)
        if not path or pure.is_absolute() or any(part in ("..", "") for part in pure.parts):
            raise UnsafePath(path=path, reason="workspace paths are relative and stay inside it")
        parts = [part for part in pure.parts if part != "."]
        if not parts:
            raise UnsafePath(path=path, reason="it names the workspace itself")
        return "/".join(parts)

    def read_bytes(self, path: str) -> bytes:
        """Read a workspace file (symlinks refused)."""
        rel = self.normalize(path)
        with self._parent(rel, create=False) as (dir_fd, name):
            # O_NONBLOCK: a FIFO planted here must not hang the read.
            fd = self._open(name, os.O_RDONLY | os.O_NONBLOCK, dir_fd, rel)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise UnsafePath(path=rel, reason="it is not a regular file")
                chunks = []
                while chunk := os.read(fd, 1 << 20):
                    chunks.append(chunk)
                return b"".join(chunks)
            finally:
                os.close(fd)

    def read_text(self, path: str) -> str:
        """Read a workspace file as UTF-8 text."""
        return self.read_bytes(path).decode("utf-8")

    def exists(self, path: str) -> bool:
        """True when the file exists (as a regular file) in the workspace."""
        return self.current_sha256(path) is not None

    def current_sha256(self, path: str) -> str | None:
        """The SHA-256 of the file as it is on disk now, or None when it is missing."""
        try:
            return sha256_bytes(self.read_bytes(path))
        except FileNotFoundError:
            return None

    def write(self, path: str, data: bytes | str) -> str:
        """Replace a file atomically and durably; record and return its SHA-256."""
        rel = self.normalize(path)
        payload = data.encode("utf-8") if isinstance(data, str) else data
        with self._parent(rel, create=True) as (dir_fd, name):
            temp = f".{name}.{secrets.token_hex(6)}.tmp"
            fd = os.open(
                temp,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o644,
                dir_fd=dir_fd,
            )
            try:
                try:
                    view = memoryview(payload)
                    while view:
                        view = view[os.write(fd, view) :]
                    if self.sync:
                        fsync_fd(fd)
                finally:
                    os.close(fd)
                target = _lstat(name, dir_fd)
                if target is not None and not stat.S_ISREG(target.st_mode):
                    # rename would replace the link itself; refuse so the user sees it.
                    raise UnsafePath(path=rel, reason="a symlink or directory stands there")
                os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                _unlink_quietly(temp, dir_fd)
                raise
            if self.sync:
                fsync_fd(dir_fd)
        digest = sha256_bytes(payload)
        self._written[rel] = digest
        return digest

    def take_written(self) -> dict[str, str]:
        """The files written since the last call, path -> SHA-256; clears the record."""
        written, self._written = self._written, {}
        return written

    def changed(
        self,
        recorded: Mapping[str, str],
        *,
        also_accept: Mapping[str, set[str]] | None = None,
    ) -> list[str]:
        """Paths whose file no longer has a recorded (or otherwise accepted) hash."""
        extra = also_accept or {}
        changed = []
        for path, digest in sorted(recorded.items()):
            try:
                now = self.current_sha256(path)
            except UnsafePath:
                now = None
            if now != digest and now not in extra.get(path, set()):
                changed.append(path)
        return changed

    def verify(
        self,
        recorded: Mapping[str, str],
        *,
        run_id: str,
        also_accept: Mapping[str, set[str]] | None = None,
    ) -> None:
        """Raise ``WorkspaceChanged`` naming every path that no longer matches."""
        changed = self.changed(recorded, also_accept=also_accept)
        if changed:
            raise WorkspaceChanged(run_id=run_id, paths=changed)

    # -- internals --------------------------------------------------------------------

    @contextmanager
    def _parent(self, rel: str, *, create: bool) -> Iterator[tuple[int, str]]:
        """Walk to the directory holding ``rel`` one component at a time, refusing symlinks."""
        *dirs, name = rel.split("/")
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            for part in dirs:
                try:
                    next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(part, 0o755, dir_fd=fd)
                    if self.sync:
                        fsync_fd(fd)  # the new directory's entry must survive a power cut
                    next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise UnsafePath(path=rel, reason=_in_the_way(part, fd)) from exc
                    raise
                os.close(fd)
                fd = next_fd
            yield fd, name
        finally:
            os.close(fd)

    def _open(self, name: str, flags: int, dir_fd: int, rel: str) -> int:
        try:
            return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafePath(path=rel, reason="it is a symlink") from exc
            raise


def _in_the_way(part: str, dir_fd: int) -> str:
    """Say what stands where the directory ``part`` should be."""
    info = _lstat(part, dir_fd)
    if info is not None and stat.S_ISLNK(info.st_mode):
        return f"{part!r} is a symlink"
    return f"{part!r} is not a directory (a file is in the way)"


def _lstat(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _unlink_quietly(name: str, dir_fd: int) -> None:
    with suppress(OSError):
        os.unlink(name, dir_fd=dir_fd)
