"""Enumerating the disks a power cut may leave, from a durability model.

Given the :class:`~.ops.DurabilityModel` at one point of the op log,
:func:`enumerate_images` lists the legal disks (see :mod:`.model` for the rules), the
extremes first, at most ``limit`` of them.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..._sysio import FileSystem
from .ops import ROOT, DirNode, DurabilityModel, FileNode, Op, overwrite, rename_entries

__all__ = ["DiskImage", "enumerate_images"]


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


def _dir_choices(path: str, node: DirNode, *, reorder: bool) -> list[_Choice]:
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
            rename_entries(entries, ops[i])
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


def _file_variants(path: str, node: FileNode, rng: random.Random) -> list[_Variant]:
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
                overwrite(data, op.offset, op.data[:cut])
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


def enumerate_images(  # noqa: C901 - namespaces, trees, variants, then one ordered generator: the extremes-first order lives in one place
    model: DurabilityModel, *, seed: int, limit: int, reorder: bool
) -> list[DiskImage]:
    """The disks a power cut may leave from ``model``, the extremes first, at most ``limit``."""
    paths = _paths(model)
    choices = {
        ino: _dir_choices(paths.get(ino, f"<inode {ino}>"), node, reorder=reorder)
        for ino, node in sorted(model.nodes.items())
        if isinstance(node, DirNode) and node.pending
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
            if ino not in variants and isinstance(node, FileNode):
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


def _paths(model: DurabilityModel) -> dict[int, str]:
    """Every directory inode's live path, for descriptions."""
    paths = {ROOT: "."}
    stack = [ROOT]
    while stack:
        ino = stack.pop()
        node = model.directory(ino)
        for name, child in {**node.durable, **node.live}.items():
            if child not in paths and isinstance(model.nodes.get(child), DirNode):
                paths[child] = name if ino == ROOT else f"{paths[ino]}/{name}"
                stack.append(child)
    return paths


def _tree(
    model: DurabilityModel, chosen: Mapping[int, _Choice]
) -> tuple[tuple[str, ...], dict[str, int]]:
    """The directories and files reachable from the root when ``chosen`` survived."""
    dirs: list[str] = []
    files: dict[str, int] = {}
    stack: list[tuple[int, str]] = [(ROOT, "")]
    while stack:
        ino, prefix = stack.pop()
        node = model.directory(ino)
        entries = chosen[ino].entries if ino in chosen else node.durable
        for name, child in sorted(entries.items()):
            path = prefix + name
            if isinstance(model.nodes[child], DirNode):
                dirs.append(path)
                stack.append((child, path + "/"))
            else:
                files[path] = child
    return tuple(sorted(dirs)), files
