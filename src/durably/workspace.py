"""The workspace: the files a run writes, each recorded by its SHA-256.

Tools write through a :class:`Workspace`, never around it. A write is synced
(the file, and any directory it had to create) before it returns, so the result
save that records its hash never describes a file the disk could still lose. On
every resume the loop verifies the recorded hashes; a file changed behind the
run's back stops it with ``WorkspaceChanged`` rather than letting the model
reason about files its conversation does not describe.

Paths are relative to the workspace root. Absolute paths, ``..`` and symlinks
anywhere on the way are refused.

Writes use the file store's crash-atomic protocol
(:func:`durably._sysio.replace_file`) through the same :class:`FileSystem`
seam, so the power-loss model sees them. A write killed before its rename
leaves a temp file ``.<name>.<16 hex>.tmp`` beside the file; the run's next owner
removes every such file (:meth:`Workspace.remove_temp_files`) when it opens the
run, before the workspace is verified or read.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from ._sysio import FileSystem, is_temp_name, replace_file
from .errors import UnsafePath, WorkspaceChanged

__all__ = ["Workspace", "sha256_bytes"]

log = logging.getLogger("durably.workspace")


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
        fs: the system-call seam (the power-loss model and fault tests pass their own).
        mode: permission bits of the files it writes.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        sync: bool = True,
        fs: FileSystem | None = None,
        mode: int = 0o644,
    ) -> None:
        self.root = Path(root)
        self.sync = sync
        self.fs = fs or FileSystem()
        self.mode = mode
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

            def refuse_non_file() -> None:
                target = self.fs.lstat(name, dir_fd=dir_fd)
                if target is not None and not stat.S_ISREG(target.st_mode):
                    # rename would replace the link itself; refuse so the user sees it.
                    what = "a symlink" if stat.S_ISLNK(target.st_mode) else "not a regular file"
                    raise UnsafePath(path=rel, reason=f"{what} stands there")

            replace_file(
                self.fs,
                dir_fd,
                name,
                payload,
                mode=self.mode,
                sync=self.sync,
                before_rename=refuse_non_file,
            )
        digest = sha256_bytes(payload)
        self._written[rel] = digest
        return digest

    def remove_temp_files(self) -> list[str]:
        """Remove every temp file a killed write left in the workspace; return their paths.

        Called by the run's owner when it opens the run, before anything reads the
        workspace. Only names :func:`durably._sysio.temp_name` makes are removed
        (``.<name>.<16 hex>.tmp``); symlinked directories are not entered.
        """
        removed: list[str] = []
        root_fd = self.fs.open_dir(str(self.root))
        try:
            self._sweep_temps(root_fd, "", removed)
        finally:
            self.fs.close(root_fd)
        return removed

    def _sweep_temps(self, dir_fd: int, prefix: str, removed: list[str]) -> None:
        for name in sorted(self.fs.listdir(dir_fd)):
            info = self.fs.lstat(name, dir_fd=dir_fd)
            if info is None:
                continue
            if stat.S_ISDIR(info.st_mode):
                child = self.fs.open_dir_at(name, dir_fd=dir_fd)
                try:
                    self._sweep_temps(child, f"{prefix}{name}/", removed)
                finally:
                    self.fs.close(child)
            elif stat.S_ISREG(info.st_mode) and is_temp_name(name):
                self.fs.unlink(name, dir_fd=dir_fd)
                removed.append(prefix + name)
                log.info("removed %s%s left by a write that never finished", prefix, name)
        if removed and self.sync:
            self.fs.fsync(dir_fd)

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
        fs = self.fs
        fd = fs.open_dir(str(self.root))
        try:
            for part in dirs:
                try:
                    next_fd = fs.open_dir_at(part, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    fs.mkdir_at(part, 0o755, dir_fd=fd)
                    if self.sync:
                        fs.fsync(fd)  # the new directory's entry must survive a power cut
                    next_fd = fs.open_dir_at(part, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise UnsafePath(path=rel, reason=_in_the_way(part, fd)) from exc
                    raise
                fs.close(fd)
                fd = next_fd
            yield fd, name
        finally:
            fs.close(fd)

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
