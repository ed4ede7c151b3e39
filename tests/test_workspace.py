"""The workspace: writes are recorded by hash, paths stay inside, outside changes are caught."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

import durably
from durably._sysio import is_temp_name
from durably.workspace import Workspace, sha256_bytes


def sha(data: bytes) -> str:
    """SHA-256 in hex, computed here rather than by the code under test."""
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    """A workspace in its own directory, with sync on."""
    return Workspace(tmp_path / "ws")


def snapshot(directory: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every entry under ``directory``: its bytes (None for directories) and mtime."""
    entries: dict[str, tuple[bytes | None, int]] = {}
    for path in sorted(directory.rglob("*")):
        info = path.lstat()
        data = path.read_bytes() if stat.S_ISREG(info.st_mode) else None
        entries[str(path.relative_to(directory))] = (data, info.st_mtime_ns)
    return entries


def test_a_written_file_reads_back(workspace: Workspace) -> None:
    """What write stores, read_bytes and read_text give back."""
    workspace.write("notes.md", "héllo\n")
    workspace.write("data.bin", b"\x00\xff")
    assert workspace.read_text("notes.md") == "héllo\n"
    assert workspace.read_bytes("data.bin") == b"\x00\xff"
    assert (workspace.root / "notes.md").read_bytes() == "héllo\n".encode()


def test_write_returns_and_records_the_sha256(workspace: Workspace) -> None:
    """``write`` returns the SHA-256 of the content; ``take_written`` gives each last hash once."""
    first = workspace.write("a.txt", b"one")
    workspace.write("b/c.txt", "two")
    last = workspace.write("a.txt", b"three")
    assert first == sha(b"one")
    assert last == sha(b"three") == workspace.current_sha256("a.txt")
    assert workspace.take_written() == {"a.txt": sha(b"three"), "b/c.txt": sha(b"two")}
    assert workspace.take_written() == {}


def test_sha256_bytes_hashes_text_as_utf8() -> None:
    """sha256_bytes of text is the SHA-256 of its UTF-8 bytes."""
    assert sha256_bytes("é") == sha("é".encode())


def test_new_directories_are_created(workspace: Workspace) -> None:
    """Writing a/b/c/file.txt creates the missing directories."""
    workspace.write("a/b/c/file.txt", "deep")
    assert (workspace.root / "a" / "b" / "c" / "file.txt").read_text() == "deep"
    assert workspace.exists("a/b/c/file.txt")


def test_a_write_leaves_no_temp_file(workspace: Workspace) -> None:
    """After writes and overwrites only the written files are in the workspace."""
    workspace.write("x.txt", "1")
    workspace.write("x.txt", "2")
    workspace.write("d/y.txt", "3")
    assert sorted(str(p.relative_to(workspace.root)) for p in workspace.root.rglob("*")) == [
        "d",
        "d/y.txt",
        "x.txt",
    ]


def test_a_missing_file_has_no_hash(workspace: Workspace) -> None:
    """current_sha256 of a file that is not there is None, and exists is False."""
    assert workspace.current_sha256("nope.txt") is None
    assert not workspace.exists("nope.txt")
    assert workspace.current_sha256("no/dir/file.txt") is None


@pytest.mark.parametrize(
    "path", ["../x", "/etc/passwd", "a/../../x", "a/..", "..", "", ".", "./.", "//x"]
)
def test_paths_that_leave_the_workspace_are_refused(tmp_path: Path, path: str) -> None:
    """Absolute paths, `..` and the root itself are UnsafePath to write or read; nothing changes."""
    workspace = Workspace(tmp_path / "ws")
    before = snapshot(tmp_path)
    with pytest.raises(durably.UnsafePath):
        workspace.write(path, "evil")
    with pytest.raises(durably.UnsafePath):
        workspace.read_bytes(path)
    assert snapshot(tmp_path) == before


def test_a_symlinked_directory_inside_the_workspace_is_refused(
    tmp_path: Path, workspace: Workspace
) -> None:
    """A path through a symlinked directory is UnsafePath; the directory it points at stays."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    (workspace.root / "link").symlink_to(outside, target_is_directory=True)
    before = snapshot(outside)
    with pytest.raises(durably.UnsafePath):
        workspace.write("link/secret.txt", "overwritten")
    with pytest.raises(durably.UnsafePath):
        workspace.write("link/new/file.txt", "planted")
    with pytest.raises(durably.UnsafePath):
        workspace.read_bytes("link/secret.txt")
    assert snapshot(outside) == before


def test_a_symlinked_file_inside_the_workspace_is_refused(
    tmp_path: Path, workspace: Workspace
) -> None:
    """Writing or reading a path that is a symlink is UnsafePath; its target and the link stay."""
    target = tmp_path / "target.txt"
    target.write_bytes(b"keep me")
    before = (target.read_bytes(), target.stat().st_mtime_ns)
    link = workspace.root / "file.txt"
    link.symlink_to(target)
    with pytest.raises(durably.UnsafePath):
        workspace.write("file.txt", "overwritten")
    with pytest.raises(durably.UnsafePath):
        workspace.read_bytes("file.txt")
    assert (target.read_bytes(), target.stat().st_mtime_ns) == before
    assert link.is_symlink()
    assert sorted(os.listdir(workspace.root)) == ["file.txt"]
    assert workspace.take_written() == {}


def test_verify_passes_when_nothing_changed(workspace: Workspace) -> None:
    """``verify`` of the hashes a run recorded returns quietly when the files are as written."""
    recorded = {"a.txt": workspace.write("a.txt", "a"), "d/b.txt": workspace.write("d/b.txt", "b")}
    workspace.verify(recorded, run_id="r1")
    assert workspace.changed(recorded) == []


def test_verify_names_every_changed_path(workspace: Workspace) -> None:
    """A file edited, deleted or made a symlink outside the run is named by WorkspaceChanged."""
    recorded = {
        name: workspace.write(name, name)
        for name in ("same.txt", "edited.txt", "gone.txt", "d/link.txt")
    }
    (workspace.root / "edited.txt").write_text("changed")
    (workspace.root / "gone.txt").unlink()
    (workspace.root / "d" / "link.txt").unlink()
    (workspace.root / "d" / "link.txt").symlink_to(workspace.root / "same.txt")
    with pytest.raises(durably.WorkspaceChanged) as caught:
        workspace.verify(recorded, run_id="r1")
    assert caught.value.paths == ["d/link.txt", "edited.txt", "gone.txt"]
    assert caught.value.run_id == "r1"
    for path in caught.value.paths:
        assert path in str(caught.value)


def test_a_file_replaced_by_a_directory_is_changed(workspace: Workspace) -> None:
    """A recorded file that became a directory is reported as changed, not as an OS error."""
    recorded = {"a.txt": workspace.write("a.txt", "a")}
    (workspace.root / "a.txt").unlink()
    (workspace.root / "a.txt").mkdir()
    with pytest.raises(durably.WorkspaceChanged) as caught:
        workspace.verify(recorded, run_id="r1")
    assert caught.value.paths == ["a.txt"]


def test_a_file_replaced_by_a_fifo_is_changed_without_hanging(workspace: Workspace) -> None:
    """A recorded file that became a FIFO is reported as changed at once (a read would block)."""
    recorded = {"a.txt": workspace.write("a.txt", "a")}
    (workspace.root / "a.txt").unlink()
    os.mkfifo(workspace.root / "a.txt")
    with pytest.raises(durably.WorkspaceChanged) as caught:
        workspace.verify(recorded, run_id="r1")
    assert caught.value.paths == ["a.txt"]


def test_also_accepted_hashes_pass_verify(workspace: Workspace) -> None:
    """A file with a hash from also_accept (an in-doubt call's intended write) is not a change."""
    recorded = {"a.txt": workspace.write("a.txt", "before")}
    (workspace.root / "a.txt").write_text("after")
    accepted = {"a.txt": {sha(b"after")}}
    workspace.verify(recorded, run_id="r1", also_accept=accepted)
    with pytest.raises(durably.WorkspaceChanged):
        workspace.verify(recorded, run_id="r1", also_accept={"a.txt": {sha(b"other")}})
    with pytest.raises(durably.WorkspaceChanged):
        workspace.verify(recorded, run_id="r1", also_accept={"b.txt": {sha(b"after")}})


def test_a_write_over_a_directory_is_refused(workspace: Workspace) -> None:
    """Writing a file where a directory stands is UnsafePath and the directory stays."""
    (workspace.root / "d").mkdir()
    (workspace.root / "d" / "inner.txt").write_text("inner")
    with pytest.raises(durably.UnsafePath):
        workspace.write("d", "flat")
    assert (workspace.root / "d" / "inner.txt").read_text() == "inner"
    assert sorted(os.listdir(workspace.root)) == ["d"]


def test_equivalent_spellings_name_one_file(workspace: Workspace) -> None:
    """`d//./x.txt` and `d/x.txt` are the same workspace file, recorded under the canonical path."""
    digest = workspace.write("d//./x.txt", "x")
    assert workspace.take_written() == {"d/x.txt": digest}
    assert workspace.read_text("d/x.txt") == "x"


def test_a_regular_file_in_the_way_of_a_directory_is_not_called_a_symlink(
    workspace: Workspace,
) -> None:
    """A file standing where a directory of the path should be is named as a file in the way."""
    workspace.write("src", "a file, not a directory")
    with pytest.raises(durably.UnsafePath, match="not a directory") as caught:
        workspace.write("src/module.py", "x = 1")
    assert "symlink" not in str(caught.value)
    (workspace.root / "linked").symlink_to(workspace.root, target_is_directory=True)
    with pytest.raises(durably.UnsafePath, match="'linked' is a symlink"):
        workspace.write("linked/module.py", "x = 1")


def test_remove_temp_files_removes_only_what_a_killed_write_leaves(workspace: Workspace) -> None:
    """The next owner removes every ``.<name>.<16 hex>.tmp`` in any directory of the workspace,
    and nothing else: not hidden files, not other names ending in .tmp.
    """
    workspace.write("a/b/keep.py", "x")
    root = workspace.root
    (root / "a" / "b" / ".keep.py.0123456789abcdef.tmp").write_text("half")
    (root / ".top.txt.fedcba9876543210.tmp").write_text("half")
    kept = [root / ".hidden", root / "a" / "notes.tmp", root / "a" / ".x.0123456789ab.tmp"]
    for path in kept:
        path.write_text("mine")
    removed = workspace.remove_temp_files()
    assert sorted(removed) == [".top.txt.fedcba9876543210.tmp", "a/b/.keep.py.0123456789abcdef.tmp"]
    assert all(path.exists() for path in kept)
    assert workspace.read_text("a/b/keep.py") == "x"


def test_remove_temp_files_does_not_follow_a_symlinked_directory(
    workspace: Workspace, tmp_path: Path
) -> None:
    """A symlink to a directory outside is not entered: its temp-like files stay."""
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / ".data.0123456789abcdef.tmp"
    victim.write_text("not the workspace's")
    (workspace.root / "link").symlink_to(outside, target_is_directory=True)
    assert workspace.remove_temp_files() == []
    assert victim.exists()


def test_a_write_leaves_a_temp_the_owner_finds(workspace: Workspace) -> None:
    """The temp a write creates is named as remove_temp_files looks for it (killed mid-write)."""
    seen: list[str] = []
    real = workspace.fs.open

    def spy(name: str, flags: int, mode: int, *, dir_fd: int) -> int:
        seen.append(name)
        return real(name, flags, mode, dir_fd=dir_fd)

    workspace.fs.open = spy  # type: ignore[method-assign]
    workspace.write("f.txt", "data")
    assert len(seen) == 1
    assert is_temp_name(seen[0], "f.txt")
