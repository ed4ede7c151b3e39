"""The demo in real processes against a damaged or tampered state directory (issue 22)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from _helpers.patience import stretched
from durably.cli import EXIT
from durably.triage.world import World

M1 = "m1-done-after-delete"
ENV = {**os.environ, "COLUMNS": "200"}


def durably(
    *args: str | Path, timeout: float = 60, env: Mapping[str, str] = ENV
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m durably`` to its end with empty stdin; output captured."""
    return subprocess.run(
        [sys.executable, "-m", "durably", *map(str, args)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


def crash(state: Path) -> str:
    """Kill the demo right after its first patch landed; return the run ID."""
    result = durably(
        "triage", "--task", M1, "--state", state, "--approve", "off", "--die-after", "code_patch"
    )
    assert result.returncode == -signal.SIGKILL, result.stdout + result.stderr
    (checkpoint,) = (state / "runs").glob("*.json")
    return checkpoint.stem


def everything_done(state: Path, run: str) -> dict[str, object]:
    """What the run saved and did: store files, model calls, patches, workspace, effects."""
    world = World.open(state / "worlds" / run)
    files = {p.name: p.read_bytes() for p in sorted((state / "runs").iterdir())}
    workspace = {
        str(p.relative_to(world.root)): p.read_bytes()
        for p in sorted((world.root / "workspace").rglob("*"))
        if p.is_file()
    }
    done: dict[str, object] = {
        "store": files,
        "model calls": _bytes(world.model_log),
        "patches": _bytes(world.root / "patches.jsonl"),
        "workspace": workspace,
        "effects": [(e.kind, e.target) for e in world.tracker().effects()],
    }
    return done


def _bytes(path: Path) -> bytes:
    return path.read_bytes() if path.exists() else b""


def refused_twice(state: Path, run: str, text: str) -> None:
    """``show`` and a resume both fail naming ``text``, and nothing at all changes."""
    before = everything_done(state, run)
    shown = durably("show", run, "--state", state)
    assert shown.returncode == EXIT["failed"], shown.stdout + shown.stderr
    assert text in shown.stderr
    resumed = durably("triage", "--task", M1, "--state", state, "--approve", "off")
    assert resumed.returncode == EXIT["failed"], resumed.stdout + resumed.stderr
    assert text in resumed.stderr
    assert "checks passed" not in resumed.stdout
    assert everything_done(state, run) == before


def resumes_to_the_end(state: Path, run: str) -> None:
    """A resume finishes the run with every check passing and no effect twice."""
    resumed = durably("triage", "--task", M1, "--state", state, "--approve", "off")
    assert resumed.returncode == EXIT["done"], resumed.stdout + resumed.stderr
    assert f"resuming {run}" in resumed.stdout
    assert "16/16 checks passed" in resumed.stdout
    effects = [(e.kind, e.target) for e in World.open(state / "worlds" / run).tracker().effects()]
    assert len(effects) == len(set(effects)), effects


@pytest.mark.slow
def test_a_flipped_log_generation_is_refused_and_nothing_is_redone(tmp_path: Path) -> None:
    """A snapshot whose log generation was changed is corrupt: nothing re-paid, no log deleted."""
    state = tmp_path / "state"
    run = crash(state)
    snapshot = state / "runs" / f"{run}.json"
    good = snapshot.read_bytes()
    assert b'"journal":1,' in good
    snapshot.write_bytes(good.replace(b'"journal":1,', b'"journal":3,'))  # one bit: 0x31 -> 0x33

    refused_twice(state, run, f"checkpoint {snapshot} is corrupt: checksum mismatch")

    snapshot.write_bytes(good)
    resumes_to_the_end(state, run)


@pytest.mark.slow
def test_a_truncated_log_is_refused_and_nothing_is_redone(tmp_path: Path) -> None:
    """A log cut below its acknowledged saves, or emptied, is corrupt, and nothing is re-done."""
    state = tmp_path / "state"
    run = crash(state)
    log = state / "runs" / f"{run}.1.log"
    good = log.read_bytes()

    # The log's file holds space reserved past its last record (zeros: no record starts
    # with one), so half the records is half of what precedes the zeros, not of the file.
    records = len(good.rstrip(b"\0"))
    log.write_bytes(good[: records // 2])
    refused_twice(state, run, "were saved and acknowledged")
    log.write_bytes(b"")
    refused_twice(state, run, "holds nothing")
    log.unlink()
    refused_twice(state, run, "it is missing")

    log.write_bytes(good)
    os.chmod(log, 0o600)
    resumes_to_the_end(state, run)


@pytest.mark.slow
def test_a_lock_file_deleted_while_held_stops_the_owner_before_it_writes(tmp_path: Path) -> None:
    """An owner whose lock file was deleted stops at its next save with LockLost; a resume
    then finishes the run with nothing done twice.
    """
    state = tmp_path / "state"
    first = subprocess.Popen(
        [sys.executable, "-m", "durably", "triage", "--task", M1, "--state", str(state)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    )
    try:
        assert first.stdout is not None
        seen = b""
        while b"[y]es / [n]o: " not in seen:
            chunk = os.read(first.stdout.fileno(), 65536)
            assert chunk, f"exited before asking: {seen.decode()}"
            seen += chunk
        (lock,) = (state / "runs").glob("*.lock")
        run = lock.stem
        before = everything_done(state, run)
        lock.unlink()  # a tmp cleaner
        out, err = first.communicate(b"y\n", timeout=stretched(60))
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == EXIT["locked"], (seen + out).decode() + err.decode()
    assert "was deleted or replaced while this process held it" in err.decode()
    after = everything_done(state, run)
    assert after["effects"] == before["effects"]
    assert after["model calls"] == before["model calls"]

    resumes_to_the_end(state, run)


def test_a_run_id_that_is_a_path_is_refused_before_any_path_use(tmp_path: Path) -> None:
    """``triage --run ../elsewhere`` (or an absolute path) is bad usage and creates nothing."""
    state = tmp_path / "state"
    for bad in ("../elsewhere", "/etc/passwd", "a/b"):
        result = durably("triage", "--task", M1, "--state", state, "--run", bad)
        assert result.returncode == EXIT["usage"], result.stdout + result.stderr
        assert "run ID" in result.stderr
    assert sorted(tmp_path.iterdir()) == []


def test_show_on_a_missing_state_directory_creates_nothing(tmp_path: Path) -> None:
    """``show`` with a --state that does not exist names the missing store as a usage error (as
    ``runs`` and ``pending`` do), making nothing.
    """
    result = durably("show", "r1", "--state", tmp_path / "deep" / "er")
    assert result.returncode == EXIT["usage"], result.stdout + result.stderr
    assert f"{tmp_path / 'deep' / 'er' / 'runs'} does not exist" in result.stderr
    assert sorted(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["checkpoint", "log"])
def test_a_fifo_in_the_store_is_refused_without_blocking(tmp_path: Path, where: str) -> None:
    """A FIFO at a run's checkpoint or log is refused at once by show, runs and triage."""
    state = tmp_path / "state"
    run = crash(state)
    path = state / "runs" / (f"{run}.json" if where == "checkpoint" else f"{run}.1.log")
    path.unlink()
    os.mkfifo(path, 0o600)
    for command in (["show", run], ["runs"], ["triage", "--task", M1, "--approve", "off"]):
        result = durably(*command, "--state", state, timeout=stretched(20))
        assert result.returncode == EXIT["failed"], result.stdout + result.stderr
        assert "a FIFO" in result.stderr, result.stderr
