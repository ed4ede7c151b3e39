"""The sweep's in-memory copy of a killed process's disk, laid down again byte for byte."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from durably.sweep.tree import Tree, Uncopyable


def _listing(root: Path) -> dict[str, tuple[int, int, bytes | str | None]]:
    """Everything under root: (type and mode, modification time, contents or link)."""
    found: dict[str, tuple[int, int, bytes | str | None]] = {}
    for directory, subdirectories, files in os.walk(root):
        for name in subdirectories + files:
            path = Path(directory, name)
            info = path.lstat()
            if path.is_symlink():
                content: bytes | str | None = os.readlink(path)
            elif path.is_dir():
                content = None
            else:
                content = path.read_bytes()
            found[str(path.relative_to(root))] = (info.st_mode, info.st_mtime_ns, content)
    return found


def _world(root: Path) -> None:
    (root / "runs" / "deep").mkdir(parents=True)
    (root / "runs" / "run.json").write_bytes(b'{"turns": 3}')
    (root / "runs" / "run.json").chmod(0o600)
    (root / "runs" / ".run.json.1a2b.tmp").write_bytes(b"\x00half")
    (root / "runs" / "deep" / "empty").write_bytes(b"")
    (root / "runs").chmod(0o700)
    (root / "tracker.db-wal").write_bytes(os.urandom(4096))
    (root / "link").symlink_to("runs/run.json")
    (root / "dangling").symlink_to("nowhere")
    (root / "locked").mkdir()
    (root / "locked" / "kept").write_bytes(b"x")
    (root / "locked").chmod(0o500)
    os.utime(root / "tracker.db-wal", ns=(1, 1_000_000_123))


def test_a_tree_is_laid_down_exactly_as_it_was_read(tmp_path: Path) -> None:
    """A tree read and written elsewhere has the same files, links, modes, times and bytes."""
    source = tmp_path / "source"
    source.mkdir()
    _world(source)
    tree = Tree.read(source)
    copy = tmp_path / "copy"
    tree.write(copy)
    assert _listing(copy) == _listing(source)
    assert stat.S_IMODE((copy / "locked").stat().st_mode) == 0o500
    assert (copy / "tracker.db-wal").stat().st_mtime_ns == 1_000_000_123


def test_writing_again_removes_what_a_restart_added_and_restores_what_it_changed(
    tmp_path: Path,
) -> None:
    """Writing a tree again undoes a restart's changes: new files go, changed ones return."""
    root = tmp_path / "world"
    root.mkdir()
    _world(root)
    before = _listing(root)
    tree = Tree.read(root)
    (root / "runs" / "run.json").write_bytes(b'{"turns": 4}')
    (root / "runs" / "new.log").write_bytes(b"appended")
    (root / "link").unlink()
    tree.write(root)
    assert _listing(root) == before
    tree.write(root)  # and again, over its own copy
    assert _listing(root) == before


def test_a_fifo_cannot_be_copied_and_says_where_it_is(tmp_path: Path) -> None:
    """A FIFO cannot be kept in memory, and the error names it."""
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(Uncopyable, match="pipe"):
        Tree.read(tmp_path)


def test_a_tree_too_large_to_keep_in_memory_is_refused(tmp_path: Path) -> None:
    """A tree larger than ``max_bytes`` is refused, naming the limit."""
    (tmp_path / "a").write_bytes(b"x" * 600)
    (tmp_path / "b").write_bytes(b"y" * 600)
    assert len(Tree.read(tmp_path, max_bytes=1200).entries) == 2
    with pytest.raises(Uncopyable, match="more than 1000 bytes"):
        Tree.read(tmp_path, max_bytes=1000)
