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

The checks built on it are in :mod:`durably.sweep.powerloss.checks`.
"""

from __future__ import annotations

import copy
import os
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..._sysio import FileSystem

__all__ = ["DiskImage", "Op", "PowerLossFS"]

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
    """Sets of ops that may survive together.

    An op survives only with every earlier op that names one of its entries (so same-name
    operations persist in order).
    """

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
        key = candidate._key()  # noqa: SLF001 -- a disk image's own identity (same module)
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
