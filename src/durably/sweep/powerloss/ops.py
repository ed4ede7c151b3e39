"""The op log and the durability model it builds, the bottom of power-loss mode.

An :class:`Op` is one operation the store made through the file system. Applied in
order to a :class:`DurabilityModel`, the ops leave per file its synced content and the
writes since, and per directory its durable entries and the name operations since its
last ``fsync``: what a power cut may take away. :mod:`.images` lists the disks that
leaves; :mod:`.model` records the ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["ROOT", "DirNode", "DurabilityModel", "FileNode", "Op", "overwrite", "rename_entries"]

ROOT = 0
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
class FileNode:
    """A file: the content its last ``fsync`` made durable, and the data ops since."""

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
                overwrite(data, op.offset, op.data)
        return bytes(data)


@dataclass
class DirNode:
    """A directory: its durable entries, the name ops since its last ``fsync``, its entries now."""

    durable: dict[str, int] = field(default_factory=dict)
    pending: list[Op] = field(default_factory=list)
    live: dict[str, int] = field(default_factory=dict)


@dataclass
class DurabilityModel:
    """Every modelled file and directory by inode number."""

    nodes: dict[int, FileNode | DirNode]

    def directory(self, ino: int) -> DirNode:
        """The directory ``ino``; TypeError when it is a file."""
        node = self.nodes[ino]
        if not isinstance(node, DirNode):
            raise TypeError(f"inode {ino} is not a directory")
        return node

    def apply(self, op: Op) -> None:
        """Record one op: pending in its file or directory, or a sync of it."""
        if not op.mutates:
            return
        if op.kind in _NAME_OPS and op.dir is not None:
            parent = self.directory(op.dir)
            parent.pending.append(op)
            if op.kind in ("mkdir", "create") and op.ino is not None:
                self.nodes[op.ino] = DirNode() if op.kind == "mkdir" else FileNode()
            rename_entries(parent.live, op)
        elif op.kind in _DATA_OPS and op.ino is not None:
            node = self.nodes[op.ino]
            if isinstance(node, FileNode):
                node.pending.append(op)
        elif op.kind == "fsync" and op.ino is not None:
            node = self.nodes[op.ino]
            if isinstance(node, FileNode):
                node.synced, node.pending = node.content(), []
            else:
                node.durable, node.pending = dict(node.live), []


def rename_entries(entries: dict[str, int], op: Op) -> None:
    """Apply one name operation to a directory's entries."""
    if op.kind in ("mkdir", "create") and op.ino is not None:
        entries[op.name] = op.ino
    elif op.kind == "rename" and op.ino is not None:
        entries.pop(op.name, None)
        entries[op.target] = op.ino
    elif op.kind == "unlink":
        entries.pop(op.name, None)


def overwrite(data: bytearray, offset: int, chunk: bytes) -> None:
    """Write ``chunk`` into ``data`` at ``offset``, zero-filling a gap."""
    if len(data) < offset:
        data.extend(bytes(offset - len(data)))
    data[offset : offset + len(chunk)] = chunk
