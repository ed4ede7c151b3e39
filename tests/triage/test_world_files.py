"""The files the demo's world writes: never through a planted symlink, private where they hold
what the services received or the conversation (issue 22, items 4 and 7).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from _helpers.patience import stretched
from durably._sysio import append_line, write_file
from durably.models import CallLog
from durably.triage.tools import _record_patch, patches_log
from durably.triage.world import World

TASK = "m1-done-after-delete"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file another user owns, as far as the test is concerned: it must never change."""
    path = tmp_path / "victim"
    path.write_text("precious\n")
    return path


@pytest.fixture
def no_umask() -> Iterator[None]:
    """Run with umask 000, the most permissive a user can have."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    """The permission bits of ``path`` itself (never a link's target)."""
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_log_line_is_never_appended_through_a_symlink(tmp_path: Path, victim: Path) -> None:
    """model_calls.jsonl and patches.jsonl planted as links are refused (ELOOP), not followed."""
    world = World.create(tmp_path / "world", TASK)
    for log in (world.model_log, patches_log(world)):
        log.symlink_to(victim)
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        CallLog(world.model_log).append("run", 1)
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        _record_patch(world, path="todo/store.py", key="k1")
    assert victim.read_text() == "precious\n"


def test_a_replaced_file_replaces_a_planted_link_not_its_target(
    tmp_path: Path, victim: Path
) -> None:
    """checks.json and recording.json are written by rename over the name: a link planted there
    is replaced, its target left alone; the new file is 0600.
    """
    target = tmp_path / "checks.json"
    target.symlink_to(victim)
    write_file(target, b"[]\n")
    assert victim.read_text() == "precious\n"
    assert not target.is_symlink()
    assert target.read_bytes() == b"[]\n"
    assert mode(target) == 0o600


def test_append_line_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    """A FIFO at a log's name is refused at once, not written into."""
    fifo = tmp_path / "log"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match=r"No such device|not a regular file"):
        append_line(fifo, b"x\n")


def test_world_files_are_private_whatever_the_umask(tmp_path: Path, no_umask: None) -> None:
    """Under umask 000 the world's directory (and worlds/) is 0700 and the tracker's database,
    its -wal and -shm 0600.
    """
    root = tmp_path / "worlds" / "run-1"
    world = World.create(root, TASK)
    world.tracker().file_issue(title="t", body="b", cause="c", reports=["r1"], key="k")
    assert mode(tmp_path / "worlds") == 0o700
    assert mode(root) == 0o700
    for name in ("tracker.db", "tracker.db-wal", "tracker.db-shm"):
        assert mode(root / name) == 0o600, name


@pytest.mark.slow
def test_the_demo_leaves_its_world_private_and_writes_no_file_through_a_link(
    tmp_path: Path, victim: Path
) -> None:
    """Run to the end twice: the second run (already done) writes checks.json again, over a link
    planted at its name, and the victim is untouched; recording files are 0600.
    """
    state = tmp_path / "state"
    command = [sys.executable, "-m", "durably", "triage", "--task", TASK, "--approve", "off"]
    command += ["--model", "replay", "--state", str(state)]
    first = subprocess.run(
        command, capture_output=True, text=True, timeout=stretched(120), check=False
    )
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    (world,) = (state / "worlds").iterdir()
    checks = world / "checks.json"
    checks.unlink()
    checks.symlink_to(victim)
    again = subprocess.run(
        [*command, "--run", world.name],
        capture_output=True,
        text=True,
        timeout=stretched(120),
        check=False,
    )
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert victim.read_text() == "precious\n"
    assert not checks.is_symlink()
    assert mode(world) == 0o700
    for name in ("checks.json", "model.txt", "model_calls.jsonl", "tracker.db"):
        assert mode(world / name) == 0o600, name
