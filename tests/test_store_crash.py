"""Real crashes: child processes SIGKILLed inside a save, and runs held by processes that die."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

import durably
from _helpers import run_child, start_child
from _helpers.patience import stretched
from _helpers.samples import state_a, state_b, without_saved_at
from durably.stores.file import FileStore

SAVE_POINTS = [
    ("store.save.temp_written", "old"),
    ("store.save.temp_synced", "old"),
    ("store.save.renamed", "new"),
    ("store.save.dir_synced", "new"),
]


def temp_files(directory: Path) -> list[str]:
    """Temp files a save left in the state directory."""
    return [name for name in os.listdir(directory) if name.endswith(".tmp")]


@pytest.mark.parametrize(("label", "survivor"), SAVE_POINTS)
def test_a_crash_inside_a_save_leaves_the_old_or_the_new_state(
    state_dir: Path, label: str, survivor: str
) -> None:
    """A process SIGKILLed at any point of a save leaves exactly the old state (before the rename)
    or the new one (after it), never a mix; the next open removes the dead save's temp file.
    """
    child = run_child("crash", str(state_dir), "r1", label)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert len(temp_files(state_dir)) == (1 if survivor == "old" else 0)
    store = FileStore(state_dir)
    handle, loaded = store.open_sync("r1")
    handle.close_sync()
    store.close_sync()
    expected = state_a("r1") if survivor == "old" else state_b("r1")
    assert without_saved_at(loaded) == expected
    assert loaded.saved_at is not None
    assert temp_files(state_dir) == []


@pytest.mark.parametrize(
    ("label", "exists"),
    [("store.save.temp_synced", False), ("store.save.renamed", True)],
)
def test_a_crash_inside_the_first_save_leaves_no_half_run(
    state_dir: Path, label: str, exists: bool
) -> None:
    """A process killed while creating a run leaves either no run (and the ID can be created
    again, since nothing was ever saved under it) or the whole first state (and the ID is used).
    """
    child = run_child("crash-create", str(state_dir), "r1", label)
    assert child.returncode == -signal.SIGKILL, child.stderr
    store = FileStore(state_dir)
    if exists:
        handle, loaded = store.open_sync("r1")
        handle.close_sync()
        assert without_saved_at(loaded) == state_a("r1")
        assert store.list_runs_sync() == ["r1"]
    else:
        with pytest.raises(durably.RunNotFound):
            store.open_sync("r1")
        assert store.list_runs_sync() == []
    if exists:
        with pytest.raises(durably.RunExists):
            store.create_sync(state_a("r1"))
    else:
        handle = store.create_sync(state_a("r1"))
        handle.close_sync()
        assert temp_files(state_dir) == []
        assert without_saved_at(store.read_sync("r1")) == state_a("r1")
    store.close_sync()


def test_a_run_held_by_another_process_is_locked_until_that_process_dies(
    state_dir: Path,
) -> None:
    """While one process holds a run, another gets Locked at once; once the holder is SIGKILLed
    the run opens, and the lock file is the same inode throughout.
    """
    store = FileStore(state_dir)
    store.create_sync(state_a("r1")).close_sync()
    lock = state_dir / "r1.lock"
    inode = lock.stat().st_ino
    with start_child("hold", str(state_dir), "r1") as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "ready"
            assert lock.stat().st_ino == inode
            second = run_child("try-open", str(state_dir), "r1")
            assert second.returncode == 0, second.stderr
            attempt = json.loads(second.stdout)
            assert attempt["outcome"] == "locked"
            assert attempt["seconds"] < 5, "Locked must come at once, not after waiting"
            with pytest.raises(durably.Locked):
                store.open_sync("r1")
            os.kill(holder.pid, signal.SIGKILL)
            assert holder.wait(timeout=stretched(30)) == -signal.SIGKILL
        finally:
            if holder.poll() is None:
                holder.kill()
    assert lock.stat().st_ino == inode
    third = run_child("try-open", str(state_dir), "r1")
    assert json.loads(third.stdout)["outcome"] == "opened", third.stderr
    handle, loaded = store.open_sync("r1")
    handle.close_sync()
    store.close_sync()
    assert without_saved_at(loaded) == state_a("r1")
    assert lock.stat().st_ino == inode
