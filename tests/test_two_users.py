"""Another local user cannot make this user's agent carry on a run they forged (issue 22).

Run with two real users: the test (root in CI) is the victim, and a throwaway user
made with ``useradd`` for the test (removed after it, as the Postgres tests make and
remove a cluster) is the attacker, acting through ``runuser``.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from _helpers.patience import stretched
from _helpers.two_users import NEEDS_TWO_USERS, as_user
from durably.cli import EXIT

M1 = "m1-done-after-delete"
ENV = {**os.environ, "COLUMNS": "200"}

pytestmark = NEEDS_TWO_USERS


def durably(*args: str | Path, umask: int | None = None) -> subprocess.CompletedProcess[str]:
    """Run the durably command as this (the victim's) user."""
    return subprocess.run(
        [sys.executable, "-m", "durably", *map(str, args)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=stretched(60),
        check=False,
        preexec_fn=(lambda: os.umask(umask)) if umask is not None else None,
    )


@pytest.mark.slow
def test_a_forged_checkpoint_from_another_user_is_refused(mallory: str, shared: Path) -> None:
    """Under umask 000 durably still makes its directories 0700, so another user cannot plant a
    checkpoint in them; one planted in directories that user owns, or a checkpoint file that
    user owns, is refused naming the path, the owner and the mode, and nothing runs.
    """
    mine = shared / "mine"
    crashed = durably(
        "triage",
        "--task",
        M1,
        "--state",
        mine,
        "--approve",
        "off",
        "--die-after",
        "code_patch",
        umask=0,
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
    (checkpoint,) = (mine / "runs").glob("*.json")
    run = checkpoint.stem
    made = [mine, mine / "runs", mine / "worlds", mine / "worlds" / run]
    assert {d.name: stat.S_IMODE(d.stat().st_mode) for d in made} == {d.name: 0o700 for d in made}
    planted = as_user(mallory, f"echo forged > {mine / 'runs' / 'x.json'}")
    assert planted.returncode != 0
    assert "Permission denied" in planted.stderr

    # The attacker lays out a state directory of their own, 0777, with a forged checkpoint.
    forged = shared / "forged.json"
    shutil.copy(checkpoint, forged)
    forged.chmod(0o644)
    theirs = shared / "theirs"
    laid_out = as_user(
        mallory,
        f"mkdir -m 777 {theirs} {theirs / 'runs'} && cp {forged} {theirs / 'runs'}/{run}.json"
        f" && chmod 666 {theirs / 'runs'}/{run}.json",
    )
    assert laid_out.returncode == 0, laid_out.stderr
    for command in (
        ["triage", "--task", M1, "--run", run, "--approve", "off"],
        ["show", run],
        ["runs"],
    ):
        result = durably(*command, "--state", theirs)
        assert result.returncode == EXIT["failed"], result.stdout + result.stderr
        assert f"refusing to use {theirs}" in result.stderr
        assert f"({mallory}) with mode 0777" in result.stderr
    assert sorted(p.name for p in theirs.iterdir()) == ["runs"]  # no world, nothing ran

    # A checkpoint file the attacker owns, in directories that are the victim's own.
    shutil.chown(checkpoint, user=mallory)
    before = checkpoint.read_bytes()
    resumed = durably("triage", "--task", M1, "--state", mine, "--approve", "off")
    assert resumed.returncode == EXIT["failed"], resumed.stdout + resumed.stderr
    assert f"refusing to use {checkpoint}: it is owned by uid" in resumed.stderr
    assert f"({mallory}) with mode 0600" in resumed.stderr
    assert "checks passed" not in resumed.stdout
    assert checkpoint.read_bytes() == before


PLANTED = (
    "import pathlib\n"
    "pathlib.Path(__file__).with_name('ran-as-the-victim').write_text('imported')\n"
    "def agent():\n"
    "    raise SystemExit('the planted factory ran')\n"
)


def durably_in(cwd: Path, *args: str, script: bool) -> subprocess.CompletedProcess[str]:
    """Run ``durably`` as the victim from ``cwd``: the installed script, or ``python -m``."""
    command = (
        [str(Path(sys.executable).with_name("durably"))]
        if script
        else [
            sys.executable,
            "-m",
            "durably",
        ]
    )
    environment = {key: value for key, value in ENV.items() if key != "PYTHONPATH"}
    return subprocess.run(
        [*command, *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=environment,
        timeout=stretched(60),
        check=False,
    )


@pytest.mark.parametrize("script", [True, False], ids=["durably script", "python -m durably"])
def test_code_another_user_planted_in_the_current_directory_is_never_imported(
    mallory: str, shared: Path, script: bool
) -> None:
    """``resume --agent`` and ``worker``/``submit --import`` run from a directory others can
    write import nothing from it, and say how to name the code's directory; from the
    person's own directory the same commands import the agent (issue 31, item 3).
    """
    planted = as_user(mallory, f"cat > {shared}/planted_agent.py <<'EOF'\n{PLANTED}EOF\n")
    assert planted.returncode == 0, planted.stderr
    marker = shared / "ran-as-the-victim"
    for command in (
        ["resume", "some-run", "runs", "--agent", "planted_agent:agent"],
        ["worker", "--dsn", "postgresql:///nowhere", "--import", "planted_agent"],
        ["submit", "--dsn", "postgresql:///nowhere", "--agent", "x", "--import", "planted_agent"],
    ):
        result = durably_in(shared, *command, script=script)
        assert result.returncode == EXIT["usage"], result.stdout + result.stderr
        assert "cannot import 'planted_agent'" in result.stderr
        assert "the current directory is not imported from" in result.stderr
        assert "PYTHONPATH=DIR" in result.stderr
        assert not marker.exists(), command

    own = Path(tempfile.mkdtemp(prefix="durably-own-"))  # 0700, the victim's
    try:
        (own / "planted_agent.py").write_text(PLANTED)
        for command in (
            ["resume", "some-run", "runs", "--agent", "planted_agent:agent"],
            [
                "submit",
                "--dsn",
                "postgresql:///nowhere",
                "--agent",
                "x",
                "--import",
                "planted_agent",
            ],
        ):
            (own / "ran-as-the-victim").unlink(missing_ok=True)
            result = durably_in(own, *command, script=script)
            assert (own / "ran-as-the-victim").exists(), result.stdout + result.stderr
    finally:
        shutil.rmtree(own, ignore_errors=True)


def _state_under(parent: Path) -> Path:
    """A state directory of this user's own (0700, with its runs/) inside ``parent``."""
    state = parent / "state"
    (state / "runs").mkdir(parents=True)
    for directory in (state, state / "runs"):
        directory.chmod(0o700)
    return state


@pytest.mark.parametrize("parent_is", ["another user's", "group-writable", "world-writable"])
def test_a_state_directory_another_user_can_swap_out_is_refused(
    mallory: str, shared: Path, parent_is: str
) -> None:
    """A state directory of ours under a parent another user owns, or one group or others
    can write without the sticky bit, is UnsafePath naming that parent: its owner or
    writers could rename the state directory away and put theirs in its place.
    """
    from durably import FileStore, UnsafePath

    parent = shared / "parent"
    parent.mkdir(mode=0o755)
    if parent_is == "another user's":
        shutil.chown(parent, user=mallory)
    else:
        parent.chmod(0o775 if parent_is == "group-writable" else 0o777)
    mode = stat.S_IMODE(parent.stat().st_mode)
    state = _state_under(parent)
    with pytest.raises(UnsafePath, match=f"refusing to use {parent}: it is a parent of") as err:
        FileStore(state / "runs").list_runs_sync()
    assert f"with mode {mode:04o}" in str(err.value)
    shown = durably("show", "some-run", "--state", state)
    assert shown.returncode == EXIT["failed"], shown.stdout + shown.stderr
    assert f"refusing to use {parent}: it is a parent of the state directory" in shown.stderr
    if parent_is == "another user's":
        assert f"({mallory}) with mode 0755" in shown.stderr
    # Nothing was made in the refused place.
    assert sorted(p.name for p in (state / "runs").iterdir()) == []


def test_a_state_directory_in_a_sticky_shared_directory_is_used(shared: Path) -> None:
    """A sticky, world-writable parent owned by root (a shared /tmp) does not make a state
    directory of ours unsafe: there only an entry's owner can rename it.
    """
    from durably import FileStore

    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    state = _state_under(shared)
    assert FileStore(state / "runs").list_runs_sync() == []
    real_tmp = Path(tempfile.mkdtemp())  # in the system's /tmp
    try:
        assert FileStore(_state_under(real_tmp) / "runs").list_runs_sync() == []
    finally:
        shutil.rmtree(real_tmp)
    ran = durably("runs", "--state", state)
    assert ran.returncode == EXIT["done"], ran.stdout + ran.stderr
