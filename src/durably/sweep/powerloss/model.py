"""Power-loss mode: a file system that remembers what a power cut may take away.

In the manner of SQLite's crash VFS, LevelDB's fault-injection ``Env`` and ALICE
(Pillai et al., OSDI 2014), :class:`PowerLossFS` performs every operation for
real, so the store works normally, and keeps beside it a model of what is
*durable*. Per file: the content its last ``fsync`` made durable and the writes
(and truncations) since; a write through a descriptor opened with ``O_DSYNC`` is
synced as it returns, and space reserved with ``allocate`` is an unsynced growth
of the file, reading as zeros. Per directory: its durable entries (name → inode) and
the directory operations (create, mkdir, rename, unlink) since its last
``fsync``, in order. Every operation is appended to an op log.

After any prefix of the op log, :meth:`PowerLossFS.images` lists the disks a
power cut may leave behind:

- unsynced file data is kept, lost (the file keeps its last synced content),
  kept for a prefix of its writes, torn (a write cut after 1 byte, half, all but
  one byte), or garbage (the unsynced byte ranges read as zeros, or as seeded
  random bytes);
- unsynced directory operations may be undone: an undone rename leaves the old
  name on the old inode, an undone create or mkdir leaves the name absent, an
  undone unlink brings the name back. With ``reorder=False`` only a suffix is
  undone (a metadata journal commits in order, as ext4 and XFS do). With
  ``reorder=True`` (the default, more adversarial) any set of operations may
  survive provided that operations naming a common entry survive in order: a
  rename survives only with the create of its source, a create that reuses a
  name only with the unlink or rename that freed it. Directories are
  independent of each other, and data is independent of names (a renamed file
  may survive with its data lost: the zero-length-file bug of delayed allocation).

The enumeration is bounded (``limit`` images per point, 48 by default) and
always starts with the extremes: everything unsynced kept, everything
unsynced lost, and the mixtures of the two; then every torn and garbage variant.

The op log and the model are :mod:`.ops`'s, the enumeration :mod:`.images`'s; the
checks built on it are in :mod:`durably.sweep.powerloss.checks`.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

from ..._sysio import FileSystem
from .images import DiskImage, enumerate_images
from .ops import ROOT, DirNode, DurabilityModel, FileNode, Op

__all__ = ["DiskImage", "Op", "PowerLossFS"]


# -- the file system -------------------------------------------------------------------


class PowerLossFS(FileSystem):
    """The real file system, plus a model of what a power cut would leave under ``root``.

    Args:
        root: the modelled directory (it must exist; what is in it now counts as
            durable). Directories found under it that were made outside this seam
            (``Path.mkdir``) are adopted as unsynced creations: nothing synced them
            where the model could see.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(os.path.abspath(root))
        self.log: list[Op] = []
        """Every operation, in order; ``images(at=n)`` is the disk after ``log[:n]``."""
        self._live = DurabilityModel(nodes={ROOT: DirNode()})
        self._next_ino = ROOT + 1
        self._fds: dict[int, int] = {}
        self._dsync: set[int] = set()
        """Descriptors opened with ``O_DSYNC``: each write is synced before it returns."""
        self._paths: dict[int, str] = {ROOT: "."}
        self._adopt_tree(self.root, ROOT, ".")
        self._initial = copy.deepcopy(self._live)

    # -- recording ----------------------------------------------------------------------

    def mark(self, label: str) -> None:
        """Record a label (a crash point, a save beginning or returning) in the op log."""
        self._record(Op(kind="mark", note=label))

    def open_dir(self, path: str) -> int:
        """Open a directory, remembering its inode when it lies under the root."""
        ino = self._dir_at(path)
        fd = super().open_dir(path)
        if ino is not None:
            self._fds[fd] = ino
        self._record(Op(kind="open_dir", path=self._rel(path), ino=ino))
        return fd

    def mkdir(self, path: str, mode: int) -> None:
        """Create a directory: an unsynced entry in its parent until the parent is synced."""
        parent = self._dir_at(os.path.dirname(os.path.abspath(path)))
        super().mkdir(path, mode)
        if parent is None:
            self._record(Op(kind="mkdir", path=self._rel(path)))
            return
        self._new_entry("mkdir", parent, os.path.basename(path))

    def open_dir_at(self, name: str, *, dir_fd: int) -> int:
        """Open a directory inside a directory descriptor, remembering its inode."""
        parent = self._fds.get(dir_fd)
        ino = self._live.directory(parent).live.get(name) if parent is not None else None
        fd = super().open_dir_at(name, dir_fd=dir_fd)
        if ino is not None:
            self._fds[fd] = ino
        path = self._child(parent, name) if parent is not None else name
        self._record(Op(kind="open_dir", path=path, ino=ino))
        return fd

    def mkdir_at(self, name: str, mode: int, *, dir_fd: int) -> None:
        """Create a directory inside a directory descriptor: unsynced until its parent is."""
        parent = self._fds.get(dir_fd)
        super().mkdir_at(name, mode, dir_fd=dir_fd)
        if parent is None:
            self._record(Op(kind="mkdir", path=name))
            return
        self._new_entry("mkdir", parent, name)

    def open(self, name: str, flags: int, mode: int, *, dir_fd: int) -> int:
        """Open a file; a creation is an unsynced entry, ``O_TRUNC`` an unsynced truncation."""
        parent = self._fds.get(dir_fd)
        known = self._live.directory(parent).live.get(name) if parent is not None else None
        fd = super().open(name, flags, mode, dir_fd=dir_fd)
        if parent is None:
            self._record(Op(kind="open", path=name))
            return fd
        ino = known
        if ino is None and flags & os.O_CREAT:
            ino = self._new_entry("create", parent, name)
        elif ino is not None and flags & os.O_TRUNC:
            self._record(Op(kind="truncate", path=self._paths[ino], ino=ino, size=0))
        if ino is not None:
            self._fds[fd] = ino
            if flags & os.O_DSYNC:
                self._dsync.add(fd)
        self._record(Op(kind="open", path=self._child(parent, name), ino=ino))
        return fd

    def write(self, fd: int, data: bytes) -> None:
        """Write at the descriptor's offset: unsynced data until the file is synced."""
        ino = self._fds.get(fd)
        offset = os.lseek(fd, 0, os.SEEK_CUR) if ino is not None else 0
        super().write(fd, data)
        self._record(
            Op(kind="write", path=self._path_of(ino), ino=ino, offset=offset, data=bytes(data))
        )
        if fd in self._dsync:  # O_DSYNC: the data (and the size it reaches) is durable now
            self._record(Op(kind="fsync", path=self._path_of(ino), ino=ino, note="O_DSYNC"))

    def allocate(self, fd: int, offset: int, length: int) -> bool:
        """Reserve space: an unsynced growth of the file, reading as zeros, until it is synced."""
        ino = self._fds.get(fd)
        size = os.fstat(fd).st_size
        done = super().allocate(fd, offset, length)
        if done and offset + length > size:
            # Modelled as a truncation that lengthens the file: a power cut keeps the
            # old size or the new one, and reserved space never holds anything but zeros.
            path = self._path_of(ino)
            self._record(Op(kind="truncate", path=path, ino=ino, size=offset + length))
        return done

    def read(self, fd: int) -> bytes:
        """Read to the end (recorded, changes nothing)."""
        data = super().read(fd)
        self._record(Op(kind="read", path=self._path_of(self._fds.get(fd))))
        return data

    def fsync(self, fd: int) -> None:
        """Sync a file (its data becomes durable) or a directory (its pending entries do)."""
        super().fsync(fd)
        ino = self._fds.get(fd)
        self._record(Op(kind="fsync", path=self._path_of(ino), ino=ino))

    def datasync(self, fd: int) -> None:
        """``fdatasync``: modelled as ``fsync`` (a file's data and its size become durable)."""
        super().datasync(fd)
        ino = self._fds.get(fd)
        self._record(Op(kind="fsync", path=self._path_of(ino), ino=ino))

    def truncate(self, fd: int, size: int) -> None:
        """Cut a file: an unsynced truncation until the file is synced."""
        super().truncate(fd, size)
        ino = self._fds.get(fd)
        self._record(Op(kind="truncate", path=self._path_of(ino), ino=ino, size=size))

    def rename(self, src: str, dst: str, *, dir_fd: int) -> None:
        """Rename within a directory: undone by a power cut until the directory is synced."""
        parent = self._fds.get(dir_fd)
        ino = self._live.directory(parent).live.get(src) if parent is not None else None
        super().rename(src, dst, dir_fd=dir_fd)
        path = self._child(parent, src) if parent is not None else src
        if parent is not None and ino is not None:
            self._paths[ino] = self._child(parent, dst)
        self._record(Op(kind="rename", path=path, dir=parent, ino=ino, name=src, target=dst))

    def unlink(self, name: str, *, dir_fd: int) -> None:
        """Remove an entry: it comes back after a power cut until the directory is synced."""
        parent = self._fds.get(dir_fd)
        super().unlink(name, dir_fd=dir_fd)
        path = self._child(parent, name) if parent is not None else name
        self._record(Op(kind="unlink", path=path, dir=parent, name=name))

    def close(self, fd: int) -> None:
        """Close a descriptor (closing syncs nothing)."""
        ino = self._fds.pop(fd, None)
        self._dsync.discard(fd)
        super().close(fd)
        self._record(Op(kind="close", path=self._path_of(ino)))

    def lstat(self, name: str, *, dir_fd: int) -> os.stat_result | None:
        """Stat an entry (recorded, changes nothing)."""
        parent = self._fds.get(dir_fd)
        path = self._child(parent, name) if parent is not None else name
        self._record(Op(kind="lstat", path=path))
        return super().lstat(name, dir_fd=dir_fd)

    def listdir(self, dir_fd: int) -> list[str]:
        """List a directory (recorded, changes nothing)."""
        self._record(Op(kind="listdir", path=self._path_of(self._fds.get(dir_fd))))
        return super().listdir(dir_fd)

    def lock(self, fd: int) -> bool:
        """Take the flock (recorded; a lock is not on disk and a power cut drops it)."""
        taken = super().lock(fd)
        note = "taken" if taken else "refused"
        self._record(Op(kind="lock", path=self._path_of(self._fds.get(fd)), note=note))
        return taken

    # -- images -------------------------------------------------------------------------

    def images(
        self, at: int | None = None, *, seed: int = 0, limit: int = 48, reorder: bool = True
    ) -> list[DiskImage]:
        """The disks a power cut after ``log[:at]`` (the whole log by default) may leave.

        Args:
            at: how many ops of the log had happened when the power went.
            seed: seeds the garbage bytes, so a failing image can be rebuilt.
            limit: at most this many images; the extremes always come first.
            reorder: let directory operations on different names survive out of
                order (see the module docstring); False undoes only a suffix.
        """
        model = self._model_at(len(self.log) if at is None else at)
        return enumerate_images(model, seed=seed, limit=limit, reorder=reorder)

    # -- internals ----------------------------------------------------------------------

    def _record(self, op: Op) -> None:
        self.log.append(op)
        self._live.apply(op)

    def _model_at(self, at: int) -> DurabilityModel:
        model = copy.deepcopy(self._initial)
        for op in self.log[:at]:
            model.apply(op)
        return model

    def _new_entry(self, kind: str, parent: int, name: str, *, note: str = "") -> int:
        ino = self._next_ino
        self._next_ino += 1
        path = self._child(parent, name)
        self._paths[ino] = path
        self._record(Op(kind=kind, path=path, dir=parent, ino=ino, name=name, note=note))
        return ino

    def _adopt_tree(self, directory: Path, ino: int, rel: str) -> None:
        """Take what already is under the root as durable."""
        node = self._live.directory(ino)
        with os.scandir(directory) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                child = self._next_ino
                self._next_ino += 1
                path = entry.name if rel == "." else f"{rel}/{entry.name}"
                if entry.is_dir(follow_symlinks=False):
                    self._live.nodes[child] = DirNode()
                    self._adopt_tree(Path(entry.path), child, path)
                elif entry.is_file(follow_symlinks=False):
                    self._live.nodes[child] = FileNode(synced=Path(entry.path).read_bytes())
                else:
                    continue
                node.durable[entry.name] = node.live[entry.name] = child
                self._paths[child] = path

    def _dir_at(self, path: str) -> int | None:
        """The inode of a directory under the root, adopting ones made outside the seam."""
        target = Path(os.path.abspath(path))
        try:
            parts = target.relative_to(self.root).parts
        except ValueError:
            return None
        ino = ROOT
        walked = self.root
        for part in parts:
            walked = walked / part
            child = self._live.directory(ino).live.get(part)
            if child is None:
                if not walked.is_dir() or walked.is_symlink():
                    return None
                child = self._new_entry("mkdir", ino, part, note="made outside the seam")
            if not isinstance(self._live.nodes[child], DirNode):
                return None
            ino = child
        return ino

    def _rel(self, path: str) -> str:
        target = Path(os.path.abspath(path))
        try:
            return str(target.relative_to(self.root))
        except ValueError:
            return str(target)

    def _child(self, parent: int | None, name: str) -> str:
        base = self._paths.get(parent, "") if parent is not None else ""
        return name if base in ("", ".") else f"{base}/{name}"

    def _path_of(self, ino: int | None) -> str:
        return self._paths.get(ino, "") if ino is not None else ""
