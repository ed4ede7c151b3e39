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

:func:`check_protocol` runs a :class:`~durably.stores.file.FileStore` over a
:class:`PowerLossFS` (create, then ``saves`` more saves of distinct states) and,
at every op-log boundary, loads every image with a fresh, normal store. Each must
load as the last save that returned or the save in progress; ``RunNotFound`` is
legal only until the create returned. :func:`check_lock_exclusion` forces the
race that deleting lock files opens: two openers holding the run at once.

Seeded mutants of the protocol (:data:`MUTANTS`, installed by :func:`seeded`)
break the real code path, never a copy of it: the four save mutants run the
real ``FileRun._write_snapshot`` over a file system with one call dropped or
swapped, the lock mutant wraps the real close and open. What catches each, in
``tests/test_powerloss.py`` (``test_each_seeded_mutant_is_caught``):

==========================  ========================  ==================================
mutant                      caught by                 violation
==========================  ========================  ==================================
no-file-fsync               check_protocol            unreadable: the renamed file's data
                                                      lost after the save returned
                                                      (``CheckpointCorrupt``, empty)
no-dir-fsync                check_protocol            lost durability: the rename undone
                                                      after the save returned
write-in-place              check_protocol            unreadable: the state file truncated
                                                      or torn mid-save
unlink-then-rename          check_protocol            lost durability: ``RunNotFound``
                                                      between the unlink and the rename
no-new-dir-sync             check_protocol            lost durability: the state directory
                                                      itself undone after the create
lock-deleted-on-release     check_lock_exclusion      two owners: the old lock inode and a
                                                      new one are both locked
workspace-no-fsync          check_workspace           lost durability: a workspace file
                                                      empty after its write returned
==========================  ========================  ==================================

:func:`check_workspace` does for the workspace what :func:`check_protocol` does
for the store: workspace writes go through the same seam and the same
crash-atomic primitive, so every legal disk after every power cut during a
series of writes (one creating a directory) must hold each file as the last
write that returned or the one in progress, never older, never torn; and the
temp files a cut leaves are exactly the ones the next owner removes.

The real protocol is checked by ``test_the_real_protocol_survives_every_power_cut``
and ``test_the_real_store_never_has_two_owners``.
"""

from __future__ import annotations

import copy
import enum
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest import mock

import msgspec

from .. import faults
from .._sysio import FileSystem
from ..errors import Locked, RunNotFound
from ..state import RunState, UserMessage
from ..stores.file import FileRun, FileStore
from ..workspace import Workspace

__all__ = [
    "MUTANTS",
    "DiskImage",
    "Exploration",
    "Kind",
    "Mutant",
    "Op",
    "PowerLossFS",
    "Violation",
    "check_lock_exclusion",
    "check_protocol",
    "check_store",
    "check_workspace",
    "explore",
    "numbered_state",
    "seeded",
]

_ROOT = 0
"""The inode number of the modelled root directory."""

_NAME_OPS = frozenset({"mkdir", "create", "rename", "unlink"})
_DATA_OPS = frozenset({"truncate", "write"})
_MUTATING = _NAME_OPS | _DATA_OPS | {"fsync"}


# -- the op log ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Op:
    """One operation the store made through the file system, as the model saw it.

    ``ino`` is the file or directory operated on (None when outside the modelled
    root); ``dir`` the directory holding ``name`` for the name operations.
    """

    kind: str
    """mkdir, create, truncate, write, fsync, rename, unlink (these change the model);
    open, open_dir, close, read, lstat, listdir, lock, mark (these do not)."""
    path: str = ""
    """The path relative to the modelled root, for people."""
    ino: int | None = None
    dir: int | None = None
    name: str = ""
    target: str = ""
    """The new name of a rename (in the same directory)."""
    offset: int = 0
    size: int = 0
    """The length of a truncate."""
    data: bytes = field(default=b"", repr=False)
    note: str = ""

    @property
    def mutates(self) -> bool:
        """True when the op changes the durability model (and so the legal images)."""
        return self.kind in _MUTATING and (self.ino is not None or self.dir is not None)

    def __str__(self) -> str:
        where = self.path or "<outside>"
        if self.kind == "write":
            return f"write {len(self.data)} bytes at {self.offset} to {where}"
        if self.kind == "truncate":
            return f"truncate {where} to {self.size}"
        if self.kind == "rename":
            return f"rename {where} -> {self.target}"
        if self.kind == "mark":
            return f"mark {self.note}"
        note = f" ({self.note})" if self.note else ""
        return f"{self.kind} {where}{note}"


# -- the durability model --------------------------------------------------------------


@dataclass
class _FileNode:
    synced: bytes = b""
    pending: list[Op] = field(default_factory=list)

    def content(self, ops: Sequence[Op] | None = None) -> bytes:
        """The synced content with ``ops`` (all pending ones by default) applied."""
        data = bytearray(self.synced)
        for op in self.pending if ops is None else ops:
            if op.kind == "truncate":
                del data[op.size :]
                data.extend(bytes(op.size - len(data)))
            else:
                _overwrite(data, op.offset, op.data)
        return bytes(data)


@dataclass
class _DirNode:
    durable: dict[str, int] = field(default_factory=dict)
    pending: list[Op] = field(default_factory=list)
    live: dict[str, int] = field(default_factory=dict)


@dataclass
class _Model:
    nodes: dict[int, _FileNode | _DirNode]

    def directory(self, ino: int) -> _DirNode:
        node = self.nodes[ino]
        if not isinstance(node, _DirNode):
            raise TypeError(f"inode {ino} is not a directory")
        return node

    def apply(self, op: Op) -> None:
        if not op.mutates:
            return
        if op.kind in _NAME_OPS and op.dir is not None:
            parent = self.directory(op.dir)
            parent.pending.append(op)
            if op.kind in ("mkdir", "create") and op.ino is not None:
                self.nodes[op.ino] = _DirNode() if op.kind == "mkdir" else _FileNode()
            _rename_entries(parent.live, op)
        elif op.kind in _DATA_OPS and op.ino is not None:
            node = self.nodes[op.ino]
            if isinstance(node, _FileNode):
                node.pending.append(op)
        elif op.kind == "fsync" and op.ino is not None:
            node = self.nodes[op.ino]
            if isinstance(node, _FileNode):
                node.synced, node.pending = node.content(), []
            else:
                node.durable, node.pending = dict(node.live), []


def _rename_entries(entries: dict[str, int], op: Op) -> None:
    """Apply one name operation to a directory's entries."""
    if op.kind in ("mkdir", "create") and op.ino is not None:
        entries[op.name] = op.ino
    elif op.kind == "rename" and op.ino is not None:
        entries.pop(op.name, None)
        entries[op.target] = op.ino
    elif op.kind == "unlink":
        entries.pop(op.name, None)


def _overwrite(data: bytearray, offset: int, chunk: bytes) -> None:
    if len(data) < offset:
        data.extend(bytes(offset - len(data)))
    data[offset : offset + len(chunk)] = chunk


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
        self._live = _Model(nodes={_ROOT: _DirNode()})
        self._next_ino = _ROOT + 1
        self._fds: dict[int, int] = {}
        self._dsync: set[int] = set()
        """Descriptors opened with ``O_DSYNC``: each write is synced before it returns."""
        self._paths: dict[int, str] = {_ROOT: "."}
        self._adopt_tree(self.root, _ROOT, ".")
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
        return _enumerate(model, seed=seed, limit=limit, reorder=reorder)

    # -- internals ----------------------------------------------------------------------

    def _record(self, op: Op) -> None:
        self.log.append(op)
        self._live.apply(op)

    def _model_at(self, at: int) -> _Model:
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
                    self._live.nodes[child] = _DirNode()
                    self._adopt_tree(Path(entry.path), child, path)
                elif entry.is_file(follow_symlinks=False):
                    self._live.nodes[child] = _FileNode(synced=Path(entry.path).read_bytes())
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
        ino = _ROOT
        walked = self.root
        for part in parts:
            walked = walked / part
            child = self._live.directory(ino).live.get(part)
            if child is None:
                if not walked.is_dir() or walked.is_symlink():
                    return None
                child = self._new_entry("mkdir", ino, part, note="made outside the seam")
            if not isinstance(self._live.nodes[child], _DirNode):
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


# -- enumerating images ----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class DiskImage:
    """One disk a power cut may leave: every directory and file under the modelled root."""

    description: str
    """Which unsynced operations survived, in words."""
    dirs: tuple[str, ...]
    """Directories, relative to the root, parents before children."""
    files: Mapping[str, bytes] = field(hash=False)
    """File contents by path relative to the root."""

    def materialise(self, target: str | os.PathLike[str]) -> Path:
        """Write the image into the new directory ``target`` (dirs 0700, files 0600)."""
        base = Path(target)
        base.mkdir(mode=0o700)
        os.chmod(base, 0o700)
        for rel in self.dirs:
            (base / rel).mkdir(mode=0o700)
            os.chmod(base / rel, 0o700)
        for rel, data in self.files.items():
            fd = os.open(base / rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                os.fchmod(fd, 0o600)
                FileSystem().write(fd, data)
            finally:
                os.close(fd)
        return base

    def _key(self) -> tuple[tuple[str, ...], tuple[tuple[str, bytes], ...]]:
        return self.dirs, tuple(sorted(self.files.items()))


@dataclass(frozen=True)
class _Choice:
    """One outcome for a directory's pending operations."""

    entries: dict[str, int]
    note: str


@dataclass(frozen=True)
class _Variant:
    """One outcome for a file's unsynced data."""

    data: bytes
    note: str


def _dir_choices(path: str, node: _DirNode, *, reorder: bool) -> list[_Choice]:
    """What a power cut may leave of a directory: all kept and all undone first."""
    ops = node.pending
    n = len(ops)
    subsets: list[tuple[int, ...]] = [tuple(range(k)) for k in (n, 0, *range(n - 1, 0, -1))]
    if reorder:
        subsets += _closed_subsets(ops, cap=256)
    choices: list[_Choice] = []
    seen: list[dict[str, int]] = []
    for kept in subsets:
        entries = dict(node.durable)
        for i in kept:
            _rename_entries(entries, ops[i])
        if entries in seen:
            continue
        seen.append(entries)
        undone = [str(ops[i]) for i in range(n) if i not in kept]
        counted = "the pending entry op" if n == 1 else f"all {n} pending entry ops"
        if not undone:
            note = f"{path}/: {counted} kept"
        elif not kept:
            note = f"{path}/: {counted} undone"
        else:
            note = f"{path}/: undone {'; '.join(undone)}"
        choices.append(_Choice(entries, note))
    return choices[:16]


def _closed_subsets(ops: Sequence[Op], *, cap: int) -> list[tuple[int, ...]]:
    """Sets of ops that may survive together: an op survives only with every earlier op
    that names one of its entries (so same-name operations persist in order)."""

    def names(op: Op) -> set[str]:
        return {op.name, op.target} - {""}

    deps = [{i for i in range(j) if names(ops[i]) & names(ops[j])} for j in range(len(ops))]
    found: list[tuple[int, ...]] = []

    def walk(j: int, kept: tuple[int, ...]) -> None:
        if len(found) >= cap:
            return
        if j == len(ops):
            found.append(kept)
            return
        if deps[j] <= set(kept):
            walk(j + 1, (*kept, j))
        walk(j + 1, kept)

    walk(0, ())
    return found


def _file_variants(path: str, node: _FileNode, rng: random.Random) -> list[_Variant]:
    """What a power cut may leave of a file's data: kept and lost first, then mixtures."""
    ops = node.pending
    if not ops:
        return [_Variant(node.synced, "")]
    n = len(ops)
    current = node.content()
    variants = [
        _Variant(current, f"{path}: unsynced data kept"),
        _Variant(node.synced, f"{path}: unsynced data lost"),
    ]
    for k in range(1, n):
        variants.append(_Variant(node.content(ops[:k]), f"{path}: first {k} of {n} ops kept"))
    for k, op in enumerate(ops):
        if op.kind != "write":
            continue
        size = len(op.data)
        for cut in sorted({1, size // 2, size - 1}):
            if 0 < cut < size:
                data = bytearray(node.content(ops[:k]))
                _overwrite(data, op.offset, op.data[:cut])
                note = f"{path}: torn, op {k + 1} of {n} wrote {cut} of {size} bytes"
                variants.append(_Variant(bytes(data), note))
    ranges = [(op.offset, op.offset + len(op.data)) for op in ops if op.kind == "write"]
    for kind in ("zeros", "random bytes"):
        data = bytearray(current)
        for start, end in ranges:
            stop = min(end, len(data))
            if start < stop:
                fill = bytes(stop - start) if kind == "zeros" else rng.randbytes(stop - start)
                data[start:stop] = fill
        variants.append(_Variant(bytes(data), f"{path}: garbage, unsynced ranges read as {kind}"))
    unique: list[_Variant] = []
    for variant in variants:
        if all(variant.data != other.data for other in unique):
            unique.append(variant)
    return unique


def _enumerate(model: _Model, *, seed: int, limit: int, reorder: bool) -> list[DiskImage]:
    paths = _paths(model)
    choices = {
        ino: _dir_choices(paths.get(ino, f"<inode {ino}>"), node, reorder=reorder)
        for ino, node in sorted(model.nodes.items())
        if isinstance(node, _DirNode) and node.pending
    }
    full = {ino: options[0] for ino, options in choices.items()}
    none = {ino: options[1] if len(options) > 1 else options[0] for ino, options in choices.items()}
    namespaces = [full, none]
    for ino, options in choices.items():
        for option in options:
            namespaces += [{**full, ino: option}, {**none, ino: option}]

    rng = random.Random(f"{seed}")  # noqa: S311 - seeded garbage bytes, reproducible on purpose
    trees: list[tuple[str, tuple[str, ...], dict[str, int]]] = []
    for chosen in namespaces:
        dirs, files = _tree(model, chosen)
        if all((dirs, files) != (d, f) for _, d, f in trees):
            note = "; ".join(c.note for c in chosen.values()) or "no pending entry ops"
            trees.append((note, dirs, files))

    variants: dict[int, list[_Variant]] = {}
    for _, _, files in trees:
        for path, ino in files.items():
            node = model.nodes[ino]
            if ino not in variants and isinstance(node, _FileNode):
                variants[ino] = _file_variants(path, node, rng)

    def dirty(tree: int) -> list[int]:
        return [ino for ino in dict.fromkeys(trees[tree][2].values()) if len(variants[ino]) > 1]

    def image(tree: int, pick: Callable[[int], _Variant], data_note: str) -> DiskImage:
        note, dirs, files = trees[tree]
        return DiskImage(
            description=f"{note}; {data_note if dirty(tree) else 'no unsynced data'}",
            dirs=dirs,
            files={path: pick(ino).data for path, ino in files.items()},
        )

    def kept(ino: int) -> _Variant:
        return variants[ino][0]

    def lost(ino: int) -> _Variant:
        return variants[ino][min(1, len(variants[ino]) - 1)]

    def candidates() -> Iterator[DiskImage]:
        yield image(0, kept, "all unsynced data kept")
        yield image(min(1, len(trees) - 1), lost, "all unsynced data lost")
        for t in range(len(trees)):
            yield image(t, lost, "all unsynced data lost")
            yield image(t, kept, "all unsynced data kept")
        for t in range(len(trees)):
            files = dirty(t)
            for ino in files:
                for variant in variants[ino][2:]:
                    if len(files) == 1:
                        yield image(t, _override(kept, ino, variant), variant.note)
                        continue
                    for rest, word in ((kept, "kept"), (lost, "lost")):
                        pick = _override(rest, ino, variant)
                        yield image(t, pick, f"{variant.note}; other unsynced data {word}")

    result: list[DiskImage] = []
    seen: set[tuple[tuple[str, ...], tuple[tuple[str, bytes], ...]]] = set()
    for candidate in candidates():
        key = candidate._key()
        if key not in seen:
            seen.add(key)
            result.append(candidate)
            if len(result) >= limit:
                break
    return result


def _override(
    rest: Callable[[int], _Variant], ino: int, variant: _Variant
) -> Callable[[int], _Variant]:
    return lambda other: variant if other == ino else rest(other)


def _paths(model: _Model) -> dict[int, str]:
    """Every directory inode's live path, for descriptions."""
    paths = {_ROOT: "."}
    stack = [_ROOT]
    while stack:
        ino = stack.pop()
        node = model.directory(ino)
        for name, child in {**node.durable, **node.live}.items():
            if child not in paths and isinstance(model.nodes.get(child), _DirNode):
                paths[child] = name if ino == _ROOT else f"{paths[ino]}/{name}"
                stack.append(child)
    return paths


def _tree(model: _Model, chosen: Mapping[int, _Choice]) -> tuple[tuple[str, ...], dict[str, int]]:
    """The directories and files reachable from the root when ``chosen`` survived."""
    dirs: list[str] = []
    files: dict[str, int] = {}
    stack: list[tuple[int, str]] = [(_ROOT, "")]
    while stack:
        ino, prefix = stack.pop()
        node = model.directory(ino)
        entries = chosen[ino].entries if ino in chosen else node.durable
        for name, child in sorted(entries.items()):
            path = prefix + name
            if isinstance(model.nodes[child], _DirNode):
                dirs.append(path)
                stack.append((child, path + "/"))
            else:
                files[path] = child
    return tuple(sorted(dirs)), files


# -- seeded mutants --------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Mutant:
    """A deliberately broken variant of the store, and the check that must catch it."""

    name: str
    flaw: str
    caught_by: str
    """``check_protocol`` or ``check_lock_exclusion``."""
    patches: tuple[tuple[type, str, object], ...]


class _FlawedFS:
    """The store's file system as one save of the snapshot protocol sees it, one step broken.

    Every call goes to the real file system except the one the flaw changes,
    so the mutant runs the store's real save (:meth:`FileRun._write_snapshot`)
    with a single system call dropped or swapped.
    """

    def __init__(self, real: FileSystem, mutation: str, *, dir_fd: int, name: str) -> None:
        self._real, self._mutation, self._dir_fd, self._name = real, mutation, dir_fd, name

    def __getattr__(self, attribute: str) -> object:
        return getattr(self._real, attribute)

    def open(self, name: str, flags: int, mode: int, *, dir_fd: int) -> int:
        if self._mutation == "write-in-place" and name.endswith(".tmp"):
            # The state file itself, truncated, instead of a new temp file.
            name, flags = self._name, (flags & ~os.O_EXCL) | os.O_TRUNC
        return self._real.open(name, flags, mode, dir_fd=dir_fd)

    def fsync(self, fd: int) -> None:
        if self._mutation == "no-dir-fsync" and fd == self._dir_fd:
            return
        if self._mutation == "no-file-fsync" and fd != self._dir_fd:
            return
        self._real.fsync(fd)

    def rename(self, src: str, dst: str, *, dir_fd: int) -> None:
        if self._mutation == "write-in-place":
            return  # the data is already in place
        if self._mutation == "unlink-then-rename" and self._real.lstat(dst, dir_fd=dir_fd):
            self._real.unlink(dst, dir_fd=dir_fd)
        self._real.rename(src, dst, dir_fd=dir_fd)


_real_write_snapshot = FileRun._write_snapshot


def _flawed_write(mutation: str) -> Callable[[FileRun, bytes], None]:
    """``FileRun._write_snapshot``, the real one, run over a :class:`_FlawedFS`."""

    def write_snapshot(self: FileRun, data: bytes) -> None:
        store = self._store
        real = store.fs
        name = self.run_id + ".json"
        store.fs = _FlawedFS(real, mutation, dir_fd=store._directory_fd(), name=name)  # type: ignore[assignment]
        try:
            _real_write_snapshot(self, data)
        finally:
            store.fs = real

    return write_snapshot


def _make_directory_unsynced(self: FileStore) -> None:
    """``FileStore._make_directory`` without syncing the new directory into its parent."""
    self.directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        self.fs.mkdir(str(self.directory), 0o700)
    except FileExistsError:
        return


_real_close_sync = FileRun.close_sync


def _close_deleting_lock(self: FileRun) -> None:
    """``FileRun.close_sync`` that deletes the lock file before the real close releases it."""
    if self._lock_fd is not None:
        store = self._store
        # Another handle may have deleted it already: the flaw is that nothing
        # ties the name to the inode this handle locked.
        with suppress(FileNotFoundError):
            store.fs.unlink(self.run_id + ".lock", dir_fd=store._directory_fd())
    _real_close_sync(self)


_real_open_sync = FileStore.open_sync


def _open_recreating_lock(self: FileStore, run_id: str) -> tuple[FileRun, RunState]:
    """``FileStore.open_sync`` that makes the lock file again when it is gone, as a store
    deleting lock files must (else no run could be reopened after a clean close)."""
    dir_fd = self._directory_fd()
    lock = run_id + ".lock"
    if self.fs.lstat(run_id + ".json", dir_fd=dir_fd) and not self.fs.lstat(lock, dir_fd=dir_fd):
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        self.fs.close(self.fs.open(lock, flags, 0o600, dir_fd=dir_fd))
    return _real_open_sync(self, run_id)


_real_workspace_init = Workspace.__init__


def _workspace_init_unsynced(self: Workspace, root: str | os.PathLike[str], **options: Any) -> None:
    """The real ``Workspace`` with its sync seam turned off: no file or directory is fsynced."""
    _real_workspace_init(self, root, **{**options, "sync": False})


def _save_mutant(name: str, flaw: str) -> Mutant:
    patch = (FileRun, "_write_snapshot", _flawed_write(name))
    return Mutant(name=name, flaw=flaw, caught_by="check_protocol", patches=(patch,))


MUTANTS: dict[str, Mutant] = {
    mutant.name: mutant
    for mutant in (
        _save_mutant("no-file-fsync", "the temp file is renamed into place without an fsync"),
        _save_mutant("no-dir-fsync", "the directory is not synced after the rename"),
        _save_mutant("write-in-place", "the state file is truncated and rewritten in place"),
        _save_mutant("unlink-then-rename", "the old state file is unlinked before the rename"),
        Mutant(
            name="no-new-dir-sync",
            flaw="a new state directory is not synced into its parent",
            caught_by="check_protocol",
            patches=((FileStore, "_make_directory", _make_directory_unsynced),),
        ),
        Mutant(
            name="workspace-no-fsync",
            flaw="the workspace's real write with its sync seam off: renamed into place unsynced",
            caught_by="check_workspace",
            patches=((Workspace, "__init__", _workspace_init_unsynced),),
        ),
        Mutant(
            name="lock-deleted-on-release",
            flaw="the lock file is unlinked on close (and made again by the next open)",
            caught_by="check_lock_exclusion",
            patches=(
                (FileRun, "close_sync", _close_deleting_lock),
                (FileStore, "open_sync", _open_recreating_lock),
            ),
        ),
    )
}
"""The seeded mutants of the save protocol, by name."""


@contextmanager
def seeded(mutant: str | None) -> Iterator[Mutant | None]:
    """Install a mutant of the store for the block (None installs nothing).

    The patches are on the classes, so they hold for every store in this process
    while the block runs: the checks are synchronous and use no other threads.
    """
    if mutant is None:
        yield None
        return
    try:
        chosen = MUTANTS[mutant]
    except KeyError as exc:
        raise ValueError(f"unknown mutant {mutant!r}; choose from {sorted(MUTANTS)}") from exc
    with ExitStack() as stack:
        for owner, attribute, replacement in chosen.patches:
            stack.enter_context(mock.patch.object(owner, attribute, replacement))
        yield chosen


# -- the checks ------------------------------------------------------------------------


class Kind(enum.StrEnum):
    """What went wrong in a violation."""

    LOST = "lost durability"
    """An older state than the last save that returned, or no run at all after the create."""
    WRONG = "wrong state"
    """A state that no save wrote, or a save that had not started."""
    UNREADABLE = "unreadable"
    """An error other than ``RunNotFound`` (a torn or garbage checkpoint, most often)."""
    TWO_OWNERS = "two owners"
    """Two handles own the run at once."""


@dataclass(frozen=True, kw_only=True)
class Violation:
    """One disk (or one interleaving) where the store broke its promise."""

    kind: Kind
    point: int
    """How many ops of the log had happened at the power cut (-1 for the lock check)."""
    where: str
    """The point in words: the last op and which saves had returned."""
    image: str
    """Which disk image (or interleaving), in words."""
    found: str
    """What loaded, or which error."""
    expected: str

    def __str__(self) -> str:
        return (
            f"{self.kind} {self.where}: on [{self.image}] found {self.found}, "
            f"expected {self.expected}"
        )


@dataclass(frozen=True, kw_only=True)
class Exploration:
    """What :func:`explore` checked and what it found."""

    violations: list[Violation]
    points: int
    """Op-log boundaries judged (creation included)."""
    states: int
    """Distinct durability states among them (each one's images are loaded once)."""
    images: int
    """Disk images materialised and loaded."""
    capped: int
    """States whose images were cut at ``limit`` (the extremes are always kept)."""
    log: list[Op]


@dataclass(frozen=True)
class _Outcome:
    save: int | None
    """The number of the save whose state loaded."""
    found: str
    missing: bool = False


def numbered_state(n: int, *, run_id: str = "r1") -> RunState:
    """State ``n`` of the checks' run: ``n`` messages, so every save's state is distinct."""
    return RunState(
        run_id=run_id,
        task="survive a power cut",
        created_at=datetime(2025, 1, 1, tzinfo=UTC),
        messages=[UserMessage(text=f"message {i}") for i in range(1, n + 1)],
    )


def explore(
    *,
    saves: int = 4,
    mutant: str | None = None,
    make_fs: Callable[[Path], PowerLossFS] = PowerLossFS,
    layout: str = "runs",
    seed: int = 0,
    limit: int = 48,
    reorder: bool = True,
    resume: bool = False,
    run_id: str = "r1",
    store: Callable[..., FileStore] = FileStore,
) -> Exploration:
    """Create a run, save it ``saves`` more times, and load every image at every point.

    Args:
        saves: saves after the create; save ``n`` writes state ``n`` (``n`` messages),
            the create being save 1.
        mutant: a name from :data:`MUTANTS` to check instead of the real store.
        make_fs: builds the modelled file system over a fresh root directory.
        layout: the state directory, relative to that root (``a/b/runs`` makes
            the store create its parents too).
        seed: seeds the garbage bytes.
        limit: images per point at most.
        reorder: see :meth:`PowerLossFS.images`.
        resume: load each image as a restarted process does (``open_sync``: take
            the lock, remove temp files) rather than with ``read_sync``.
        run_id: the run's ID.
        store: the store class (or factory taking the directory and keywords ``fs``
            and ``sync``) to check: the snapshot store by default, or the journal store.
    """
    make_store = store
    with tempfile.TemporaryDirectory(prefix="durably-powerloss-") as tmp:
        root = Path(tmp, "disk")
        root.mkdir(mode=0o700)
        scratch = Path(tmp, "images")
        scratch.mkdir(mode=0o700)
        fs = make_fs(root)
        expected = [numbered_state(n, run_id=run_id) for n in range(1, saves + 2)]
        events: list[tuple[int, int, bool]] = []

        def event(save: int, returned: bool) -> None:
            fs.mark(f"save {save} {'returned' if returned else 'begins'}")
            events.append((len(fs.log), save, returned))

        with seeded(mutant), faults.installed(faults.CrashPlan(on_point=fs.mark)):
            modelled = make_store(root / layout, fs=fs)
            try:
                event(1, returned=False)
                handle = modelled.create_sync(msgspec.structs.replace(expected[0]))
                event(1, returned=True)
                for n in range(2, saves + 2):
                    event(n, returned=False)
                    handle.save_sync(msgspec.structs.replace(expected[n - 1]))
                    event(n, returned=True)
                handle.close_sync()
            finally:
                modelled.close_sync()

        violations: list[Violation] = []
        reported: set[tuple[int, str, str, Kind]] = set()
        outcomes: dict[int, list[tuple[str, _Outcome]]] = {}
        version = 0
        loaded = 0
        capped = 0
        for point in range(len(fs.log) + 1):
            if point and fs.log[point - 1].mutates:
                version += 1
            if version not in outcomes:
                images = fs.images(at=point, seed=seed, limit=limit + 1, reorder=reorder)
                if len(images) > limit:
                    capped += 1
                    images = images[:limit]
                outcomes[version] = [
                    (
                        image.description,
                        _load(image, scratch, layout, run_id, expected, resume=resume, store=store),
                    )
                    for image in images
                ]
                loaded += len(images)
            returned = max((s for at, s, r in events if r and at <= point), default=None)
            running = max((s for at, s, r in events if not r and at <= point), default=None)
            if running == returned:
                running = None
            where = _where(fs.log, point, returned, running)
            for description, outcome in outcomes[version]:
                judged = _judge(outcome, returned, running)
                if judged is None:
                    continue
                kind, wanted = judged
                key = (version, description, outcome.found, kind)
                if key not in reported:
                    reported.add(key)
                    violations.append(
                        Violation(
                            kind=kind,
                            point=point,
                            where=where,
                            image=description,
                            found=outcome.found,
                            expected=wanted,
                        )
                    )
        return Exploration(
            violations=violations,
            points=len(fs.log) + 1,
            states=len(outcomes),
            images=loaded,
            capped=capped,
            log=list(fs.log),
        )


def check_protocol(
    *,
    saves: int = 4,
    mutant: str | None = None,
    make_fs: Callable[[Path], PowerLossFS] = PowerLossFS,
    layout: str = "runs",
    seed: int = 0,
    limit: int = 48,
    reorder: bool = True,
    resume: bool = False,
    store: Callable[..., FileStore] = FileStore,
) -> list[Violation]:
    """Every power cut during a create and ``saves`` saves, on every legal disk: the violations.

    Each disk must load (with a fresh, normal store) as the last save that returned
    or the save in progress; ``RunNotFound`` only until the create returned. See
    :func:`explore` for the arguments and for the counts.
    """
    return explore(
        saves=saves,
        mutant=mutant,
        make_fs=make_fs,
        layout=layout,
        seed=seed,
        limit=limit,
        reorder=reorder,
        resume=resume,
        store=store,
    ).violations


def check_lock_exclusion(*, mutant: str | None = None, run_id: str = "r1") -> list[Violation]:
    """Force the race that deleting lock files opens; report two owners at once, if any.

    A owns the run. B opens the lock file and, before its ``flock``, A closes the
    run. Then C opens the run. Locks belong to open file descriptions, so three
    stores in one process exclude each other exactly as three processes would.
    With lock files that stay, B owns and C gets ``Locked``. With lock files
    deleted on close, B locks the orphaned inode and C a new one: two owners.

    Args:
        mutant: a name from :data:`MUTANTS` to check instead of the real store.
        run_id: the run's ID.
    """
    with tempfile.TemporaryDirectory(prefix="durably-lock-") as tmp, seeded(mutant):
        directory = Path(tmp, "runs")
        first = FileStore(directory, sync=False)
        owner_a = first.create_sync(numbered_state(1, run_id=run_id))
        second = FileStore(directory, sync=False, fs=_Preempted(before_lock=owner_a.close_sync))
        third = FileStore(directory, sync=False)
        owners: list[FileRun] = []
        try:
            owners.append(second.open_sync(run_id)[0])
            with suppress(Locked):
                owners.append(third.open_sync(run_id)[0])
            inodes = [os.fstat(h._lock_fd).st_ino for h in owners if h._lock_fd is not None]
        finally:
            for handle in (owner_a, *owners):
                handle.close_sync()
            for store in (first, second, third):
                store.close_sync()
    if len(owners) < 2:
        return []
    return [
        Violation(
            kind=Kind.TWO_OWNERS,
            point=-1,
            where="B opened the lock file, A closed the run, B locked, then C opened",
            image="three stores on one directory",
            found=f"B and C both own the run, locking inodes {inodes[0]} and {inodes[1]}",
            expected="C gets Locked while B owns the run",
        )
    ]


WORKSPACE_FILE = "src/notes.txt"
"""The file :func:`check_workspace` writes (its first write also creates ``src/``)."""


def workspace_content(n: int) -> bytes:
    """What write ``n`` (from 1) of :func:`check_workspace` puts in the file."""
    return (f"version {n}\n" * (n * 7)).encode()


def check_workspace(
    *, mutant: str | None = None, writes: int = 3, seed: int = 0, limit: int = 48
) -> list[Violation]:
    """Every power cut during ``writes`` workspace writes, on every legal disk: the violations.

    The workspace lives under a :class:`PowerLossFS`. At every op-log boundary
    each legal disk is materialised and the file read: it must be the content
    of the last write that returned or of the write in progress (missing only
    until the first write returned). Then a workspace over that disk removes its
    temp files (as the run's next owner does): none may be left, and the file
    must read the same afterwards.

    Args:
        mutant: a name from :data:`MUTANTS` (``workspace-no-fsync``) to check instead.
        writes: how many writes of distinct contents.
        seed: seeds the garbage bytes.
        limit: images per point at most.
    """
    with tempfile.TemporaryDirectory(prefix="durably-powerloss-") as tmp:
        root = Path(tmp, "disk")
        (root / "ws").mkdir(parents=True, mode=0o700)
        scratch = Path(tmp, "images")
        scratch.mkdir(mode=0o700)
        fs = PowerLossFS(root)
        events: list[tuple[int, int, bool]] = []
        with seeded(mutant):
            workspace = Workspace(root / "ws", fs=fs)
            for n in range(1, writes + 1):
                fs.mark(f"write {n} begins")
                events.append((len(fs.log), n, False))
                workspace.write(WORKSPACE_FILE, workspace_content(n))
                fs.mark(f"write {n} returned")
                events.append((len(fs.log), n, True))
        contents = {workspace_content(n): n for n in range(1, writes + 1)}
        violations: list[Violation] = []
        seen: set[tuple[str, str]] = set()
        for point in range(len(fs.log) + 1):
            returned = max((n for at, n, r in events if r and at <= point), default=None)
            running = max((n for at, n, r in events if not r and at <= point), default=None)
            if running == returned:
                running = None
            for image in fs.images(at=point, seed=seed, limit=limit):
                found = _workspace_outcome(image, scratch, contents)
                legal = [f"write {n}" for n in (returned, running) if n is not None]
                if returned is None:
                    legal.append("missing")
                if found in legal or (found, image.description) in seen:
                    continue
                seen.add((found, image.description))
                # After a write returned, anything but it (or the next) is lost durability.
                lost = returned is not None and not (
                    found.startswith("write ") and int(found.split()[1]) > returned
                )
                violations.append(
                    Violation(
                        kind=Kind.LOST if lost else Kind.UNREADABLE,
                        point=point,
                        where=_where(fs.log, point, returned, running).replace("save", "write"),
                        image=image.description,
                        found=found,
                        expected=" or ".join(legal),
                    )
                )
        return violations


def _workspace_outcome(image: DiskImage, scratch: Path, contents: Mapping[bytes, int]) -> str:
    """Materialise a disk, read the file, clean the temps as an owner would: what was found."""
    target = Path(tempfile.mkdtemp(dir=scratch))
    try:
        base = image.materialise(target / "disk") / "ws"
        try:
            before = (base / WORKSPACE_FILE).read_bytes()
        except FileNotFoundError:
            before = None
        Workspace(base, sync=False).remove_temp_files()
        left = [p.name for p in base.rglob("*.tmp")]
        if left:
            return f"temp files left after cleanup: {left}"
        after = (base / WORKSPACE_FILE).read_bytes() if before is not None else None
        if before != after:
            return "the file changed when temp files were removed"
    finally:
        shutil.rmtree(target)
    if before is None:
        return "missing"
    if before in contents:
        return f"write {contents[before]}"
    return f"content no write made ({len(before)} bytes)"


def check_store(*, mutant: str | None = None, saves: int = 4, seed: int = 0) -> list[Violation]:
    """Both checks, :func:`check_protocol` and :func:`check_lock_exclusion`: every violation."""
    return check_protocol(saves=saves, mutant=mutant, seed=seed) + check_lock_exclusion(
        mutant=mutant
    )


class _Preempted(FileSystem):
    """The real file system, running ``before_lock`` once just before the first flock:
    the scheduler pausing this opener between its ``open`` and its ``flock``."""

    def __init__(self, *, before_lock: Callable[[], None]) -> None:
        self._before_lock: Callable[[], None] | None = before_lock

    def lock(self, fd: int) -> bool:
        if self._before_lock is not None:
            action, self._before_lock = self._before_lock, None
            action()
        return super().lock(fd)


def _load(
    image: DiskImage,
    scratch: Path,
    layout: str,
    run_id: str,
    expected: Sequence[RunState],
    *,
    resume: bool,
    store: Callable[..., FileStore] = FileStore,
) -> _Outcome:
    """Materialise an image and read (or open) the run with a fresh, normal store."""
    make_store = store
    target = Path(tempfile.mkdtemp(dir=scratch))
    try:
        image.materialise(target / "disk")
        # sync=False: the read never writes, except to create a missing state
        # directory, and nothing on this scratch copy needs to survive a power cut.
        reader = make_store(target / "disk" / layout, sync=False)
        try:
            if resume:
                handle, state = reader.open_sync(run_id)
                handle.close_sync()
            else:
                state = reader.read_sync(run_id)
        except RunNotFound:
            return _Outcome(None, "RunNotFound", missing=True)
        except Exception as exc:  # any other error is the finding, reported not raised
            message = str(exc).replace(str(target / "disk"), "<image>")
            return _Outcome(None, f"{type(exc).__name__}: {message}")
        finally:
            reader.close_sync()
    finally:
        shutil.rmtree(target)
    n = len(state.messages)
    if 1 <= n <= len(expected) and msgspec.structs.replace(state, saved_at=None) == expected[n - 1]:
        return _Outcome(n, f"save {n}")
    return _Outcome(None, f"a state no save wrote ({n} messages)")


def _judge(outcome: _Outcome, returned: int | None, running: int | None) -> tuple[Kind, str] | None:
    """None when the outcome is legal, else what is wrong and what was expected."""
    legal = [f"save {s}" for s in (returned, running) if s is not None]
    wanted = " or ".join((["RunNotFound"] if returned is None else []) + legal)
    if outcome.missing:
        return None if returned is None else (Kind.LOST, wanted)
    if outcome.save is None:
        kind = Kind.WRONG if outcome.found.startswith("a state") else Kind.UNREADABLE
        return kind, wanted
    if outcome.save in (returned, running):
        return None
    if returned is not None and outcome.save < returned:
        return Kind.LOST, wanted
    return Kind.WRONG, wanted


def _where(log: Sequence[Op], point: int, returned: int | None, running: int | None) -> str:
    last = f"after op {point} ({log[point - 1]})" if point else "before any op"
    done = f"save {returned} returned" if returned is not None else "no save returned"
    busy = f", save {running} in progress" if running is not None else ""
    return f"{last}, {done}{busy}"
