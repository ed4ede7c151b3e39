"""The ``durably`` command in real processes: the README walkthrough, locks, bad input."""

from __future__ import annotations

import errno
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from _helpers.patience import stretched
from durably import cli as durably_cli
from durably.cli import EXIT
from durably.cli import runs as cli_runs
from durably.triage.tracker import normalize_cause
from durably.triage.world import TASKS, World, load_task

M1 = "m1-done-after-delete"
SCRIPT = Path(sys.executable).with_name("durably")
WIDE = {**os.environ, "COLUMNS": "200"}
"""Wide enough that rich wraps no line the tests read."""
NARROW = {**os.environ, "COLUMNS": "80"}
"""What a user gets when piping the output: rich's default width."""
APPROVAL_PROMPT = "[y]es / [n]o: "


def durably(
    *args: str | Path,
    env: Mapping[str, str] = WIDE,
    timeout: float = 60,
    command: tuple[str, ...] = (sys.executable, "-m", "durably"),
) -> subprocess.CompletedProcess[str]:
    """Run the ``durably`` command to its end; stdin is empty, output is captured."""
    return subprocess.run(
        [*command, *map(str, args)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


def run_files(state: Path) -> list[Path]:
    """The checkpoint files in a state directory."""
    return sorted((state / "runs").glob("*.json"))


def only_run(state: Path) -> str:
    """The ID of the one run in a state directory."""
    files = run_files(state)
    assert len(files) == 1, files
    return files[0].stem


def read_until(process: subprocess.Popen[bytes], text: str, timeout: float) -> str:
    """Read the process's stdout as it comes until ``text`` shows; fail on EOF or timeout."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    seen = b""
    deadline = time.monotonic() + timeout
    while text.encode() not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {text!r} within {timeout}s; output so far:\n{seen.decode()}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 65536)
            assert chunk, f"exited ({process.wait()}) before {text!r}; output:\n{seen.decode()}"
            seen += chunk
    return seen.decode()


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """A state directory for the command (not created yet)."""
    return tmp_path / "state"


@pytest.fixture
def crashed(state: Path) -> str:
    """A run of m1 killed right after its first patch landed; returns its ID."""
    result = durably(
        "triage", "--task", M1, "--state", state, "--approve", "off", "--die-after", "code_patch"
    )
    assert result.returncode == -signal.SIGKILL, result.stdout + result.stderr
    return only_run(state)


def test_python_dash_m_durably_is_the_durably_script() -> None:
    """``python -m durably`` and the installed ``durably`` script are the same command."""
    module = durably("--help")
    script = durably("--help", command=(str(SCRIPT),))

    assert module.returncode == script.returncode == 0
    assert module.stdout == script.stdout
    assert "exit codes" in module.stdout


def test_readme_walkthrough_crash_show_resume(state: Path) -> None:
    """A run killed after code_patch shows its marker, and the rerun settles it at ladder step 2."""
    crash = durably(
        "triage",
        "--task",
        M1,
        "--state",
        state,
        "--approve",
        "off",
        "--die-after",
        "code_patch",
        command=(str(SCRIPT),),
    )
    assert crash.returncode == -signal.SIGKILL, crash.stdout + crash.stderr
    run = only_run(state)

    shown = durably("show", run, "--state", state, "--json", command=(str(SCRIPT),))
    assert shown.returncode == EXIT["done"], shown.stderr
    saved = json.loads(shown.stdout)
    assert saved["run_id"] == run
    assert saved["phase"] == "tools"
    assert [marker["tool"] for marker in saved["markers"].values()] == ["code_patch"]
    (in_doubt,) = saved["markers"]

    resumed = durably(
        "triage", "--task", M1, "--state", state, "--approve", "off", command=(str(SCRIPT),)
    )
    assert resumed.returncode == EXIT["done"], resumed.stdout + resumed.stderr
    assert f"resuming {run}: phase tools, turn {saved['turns']}, restart 1" in resumed.stdout
    assert f"in doubt code_patch {in_doubt}: ladder step 2 (lookup) -> found" in resumed.stdout
    assert "16/16 checks passed" in resumed.stdout
    assert only_run(state) == run

    tracker = World.open(state / "worlds" / run).tracker()
    groups = load_task(M1).groups
    issues = tracker.issues()
    assert Counter(i.cause for i in issues) == Counter(normalize_cause(g.cause) for g in groups)
    effects = tracker.effects()
    assert sorted(e.target for e in effects if e.kind == "issue") == sorted(
        i.number for i in issues
    )
    assert sorted(e.target for e in effects if e.kind == "comment") == sorted(
        i.number for i in issues
    )
    assert all(n == 1 for n in Counter((c.issue, c.body) for c in tracker.comments()).values())


def test_second_process_on_an_open_run_is_refused_at_once(state: Path) -> None:
    """A run held open by one process is refused at once to another; after a kill, it resumes."""
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "durably",
            "triage",
            "--task",
            M1,
            "--state",
            str(state),
            "--approve",
            "on",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=WIDE,
    )
    try:
        asked = read_until(first, APPROVAL_PROMPT, timeout=stretched(30))
        assert "Approve file_issue (keyed)?" in asked
        run = only_run(state)

        second = durably(
            "triage", "--task", M1, "--state", state, "--approve", "off", timeout=stretched(20)
        )
        assert first.poll() is None, "the first process must still hold the run"
    finally:
        first.kill()
        first.wait()
        for pipe in (first.stdin, first.stdout):
            if pipe is not None:
                pipe.close()

    assert second.returncode == EXIT["locked"], second.stdout + second.stderr
    assert f"run {run!r} is open in another process" in second.stderr
    assert first.returncode == -signal.SIGKILL

    third = durably("triage", "--task", M1, "--state", state, "--approve", "off")
    assert third.returncode == EXIT["done"], third.stdout + third.stderr
    assert f"resuming {run}" in third.stdout
    assert "16/16 checks passed" in third.stdout
    assert only_run(state) == run


def corrupt(state: Path, run: str) -> tuple[Path, bytes]:
    """Cut the run's checkpoint in half; return its path and the torn bytes."""
    path = state / "runs" / f"{run}.json"
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    return path, path.read_bytes()


@pytest.mark.parametrize("command", [["show", "{run}"], ["runs"]], ids=["show", "runs"])
def test_reading_a_corrupt_checkpoint_fails_naming_the_file(
    state: Path, crashed: str, command: list[str]
) -> None:
    """``show`` and ``runs`` on a torn checkpoint fail, name its path, and leave it as it was."""
    path, torn = corrupt(state, crashed)

    args = [part.format(run=crashed) for part in command]
    result = durably(*args, "--state", state, env=NARROW)

    assert result.returncode == EXIT["failed"], result.stdout + result.stderr
    assert f"checkpoint {path} is corrupt" in result.stderr
    assert path.read_bytes() == torn


def test_triage_on_a_corrupt_run_fails_and_starts_no_other(state: Path, crashed: str) -> None:
    """``triage`` never replaces a corrupt run by a fresh one: it fails naming the file."""
    path, torn = corrupt(state, crashed)
    worlds = sorted((state / "worlds").iterdir())

    result = durably("triage", "--task", M1, "--state", state, "--approve", "off", env=NARROW)

    assert result.returncode == EXIT["failed"], result.stdout + result.stderr
    assert f"checkpoint {path} is corrupt" in result.stderr
    assert run_files(state) == [path]
    assert sorted((state / "worlds").iterdir()) == worlds
    assert path.read_bytes() == torn


def test_unknown_task_is_bad_usage_and_lists_the_tasks(state: Path) -> None:
    """An unknown task exits with the usage code, lists the known tasks, and starts nothing."""
    result = durably("triage", "--task", "m9-no-such-task", "--state", state)

    assert result.returncode == EXIT["usage"]
    assert "unknown task 'm9-no-such-task'" in result.stderr
    assert all(task in result.stderr for task in TASKS)
    assert not (state / "runs").exists()
    assert not (state / "worlds").exists()


def test_die_after_an_unknown_tool_is_bad_usage(state: Path) -> None:
    """``--die-after`` with no such tool exits with the usage code and leaves no run or world."""
    result = durably("triage", "--task", M1, "--state", state, "--die-after", "no_such_tool")

    assert result.returncode == EXIT["usage"]
    assert "no tool 'no_such_tool'" in result.stderr
    assert "code_patch" in result.stderr
    assert run_files(state) == []
    assert list(state.glob("worlds/*")) == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("sweep", "--config", "keys honored"), "unknown configuration 'keys honored'"),
        (("sweep", "--jobs", "0"), "argument --jobs: 0 is too small"),
        (("sweep", "--jobs", "two"), "argument --jobs: 'two' is not a whole number"),
        (("sweep", "--json", "{tmp}/missing/sweep.json"), "{tmp}/missing' does not exist"),
        (("sweep", "--text", "{tmp}"), "is a directory: name a file in it"),
        (("triage", "--state", "{tmp}/state", "--max-dollars", "nan"), "not a positive amount"),
        (("triage", "--state", "{tmp}/state", "--max-dollars", "-1"), "not a positive amount"),
        (("triage", "--state", "{tmp}/state", "--max-turns", "0"), "0 is too small"),
        (("worker", "--dsn", "postgresql://nowhere", "--lease", "0"), "not a positive amount"),
        (("worker", "--dsn", "postgresql://nowhere", "--concurrency", "0"), "0 is too small"),
    ],
)
def test_bad_arguments_are_refused_at_once_naming_the_argument(
    tmp_path: Path, args: tuple[str, ...], says: str
) -> None:
    """A count below 1, a budget nothing could reach, an unknown configuration, or a report
    file that could not be written later: exit 2 with the reason, before any run or sweep
    starts (a sweep writes its report only after a minute of work).
    """
    result = durably(*(a.format(tmp=tmp_path) for a in args), timeout=stretched(30))

    assert result.returncode == EXIT["usage"], result.stdout + result.stderr
    assert says.format(tmp=tmp_path) in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_runs_in_a_state_directory_that_does_not_exist_says_so_and_creates_nothing(
    state: Path,
) -> None:
    """A mistyped ``--state`` is named, not shown as an empty table, and not created."""
    result = durably("runs", "--state", state)

    assert result.returncode == EXIT["usage"]
    assert f"no runs: {state / 'runs'} does not exist" in result.stderr
    assert result.stdout == ""
    assert not state.exists()


def test_runs_lists_a_finished_run_with_its_phase_and_turns(state: Path) -> None:
    """``durably runs`` shows a finished run's ID, phase ``done`` and turn count in one row."""
    finished = durably("triage", "--task", M1, "--state", state, "--approve", "off")
    assert finished.returncode == EXIT["done"], finished.stdout + finished.stderr
    run = only_run(state)
    turns = json.loads(durably("show", run, "--state", state, "--json").stdout)["turns"]

    listed = durably("runs", "--state", state)

    assert listed.returncode == EXIT["done"], listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if run in line]
    cells = [cell.strip() for cell in row.strip("│ ").split("│")]
    assert cells[:3] == [run, "done", str(turns)]
    assert turns > 0


@pytest.mark.timeout(900)
def test_the_power_loss_sweep_finds_no_violation_and_catches_every_mutant() -> None:
    """`durably sweep --power-loss` exits 0: no store loses a save, every mutant is caught,
    and the triage run resumed on every disk of every point finishes clean.
    """
    result = subprocess.run(
        [sys.executable, "-m", "durably", "sweep", "--power-loss", "--jobs", "2"],
        capture_output=True,
        text=True,
        timeout=stretched(850),
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "seeded mutants caught: 7/7" in result.stdout
    assert "lock exclusion: 0 violations" in result.stdout
    for store in ("journal", "snapshot"):
        line = next(x for x in result.stdout.splitlines() if f"{store} store):" in x)
        assert "0 load violations" in line
        assert "0 duplicates, 0 lost" in line
        assert "0 failed checks" in line


def test_a_resumed_run_keeps_the_model_it_started_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new run with no --model and no key replays; a key set later does not switch it."""
    from durably.triage.cli import _model_spec
    from durably.triage.world import World

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    world = World.create(tmp_path / "world", "m1-done-after-delete")
    assert _model_spec(None, world, resuming=False) == "replay"
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    assert _model_spec(None, world, resuming=True) == "replay"
    assert _model_spec("openai:gpt-4.1", world, resuming=True) == "openai:gpt-4.1"


@pytest.mark.timeout(300)
def test_the_sweep_on_the_journal_store_is_clean_at_depth_two_and_its_table_is_whole(
    tmp_path: Path,
) -> None:
    """`durably sweep --store journal` kills the run on the triage command's default store at
    every point and second point: nothing duplicated, lost or paid twice; the table,
    piped, is printed whole rather than cut to rich's 80 columns; and the warnings the
    kills provoke in the scenarios' processes do not flood the sweep's output.
    """
    piped = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    report = tmp_path / "sweep.json"
    result = durably(
        "sweep", "--store", "journal", "--depth", "2", "--jobs", "2",
        "--config", "keys honoured", "--json", report,
        env=piped, timeout=stretched(280),
    )  # fmt: skip
    assert result.returncode == EXIT["done"], result.stdout + result.stderr
    words = " ".join(result.stdout.split())
    assert "paid2 saved replies paid for twice" in words  # the header, and its legend
    assert "chk failed checks" in words
    assert "…" not in result.stdout
    mentions = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if "was lost before its save" in line
    ]
    assert mentions  # counted: the kills provoke them
    assert all(re.match(r"^ +\d+ x turn N's reply was lost", line) for line in mentions), mentions
    rows = json.loads(report.read_text())["rows"]
    assert [(r["config"], r["depth"]) for r in rows] == [("keys honoured", 1), ("keys honoured", 2)]
    for row in rows:
        assert row["scenarios"] > 0
        assert row["finished"] == row["scenarios"]
        assert (row["duplicates"], row["lost"], row["paid_twice"], row["failed_checks"]) == (
            (0, 0, 0, 0)
        )
        assert row["questions"] == 0


@pytest.mark.parametrize(
    ("code", "hint"),
    [
        (errno.ENOSPC, "free disk space or fix permissions"),
        (errno.EROFS, "free disk space or fix permissions"),
        (errno.ENOENT, "run the command again once that is mended"),
    ],
)
def test_an_error_the_system_raised_is_one_line_with_a_fitting_hint(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    code: int,
    hint: str,
) -> None:
    """An OSError no layer below turned into a durably error still reaches the user as the
    kernel's reason, with advice that fits it, exit 1 and no traceback.
    """

    def refused(*args: object) -> int:
        raise OSError(code, os.strerror(code), str(tmp_path / "somewhere"))

    monkeypatch.setattr(cli_runs, "_cmd_runs", refused)
    with pytest.raises(SystemExit) as exited:
        durably_cli.main(["runs", "--state", str(tmp_path)])
    assert exited.value.code == EXIT["failed"]
    err = capsys.readouterr().err
    assert os.strerror(code) in err
    assert str(tmp_path / "somewhere") in err
    assert hint in err
    assert "Traceback" not in err


def test_a_reader_that_went_away_ends_the_command_quietly(state: Path, crashed: str) -> None:
    """``durably show ... | head`` whose reader is gone: exit 1 with nothing on stderr, not a
    traceback and not advice about disk space.
    """
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte
    try:
        result = subprocess.run(
            [sys.executable, "-m", "durably", "show", crashed, "--state", str(state), "--json"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=stretched(60),
            check=False,
        )
    finally:
        os.close(write)
    assert result.returncode == EXIT["failed"]
    assert result.stderr == ""


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs of its own: a real disk to fill up and to remount read-only."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", disk], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", disk], check=True)


def fill(disk: Path, name: str) -> Path:
    """Write zeros into ``disk`` until the kernel refuses; the file that took the space."""
    ballast = disk / name
    with ballast.open("wb", buffering=0) as out:
        for chunk in (65536, 4096, 1):
            try:
                while True:
                    out.write(b"\0" * chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    return ballast


def saved(state: Path, run: str) -> dict[str, Any]:
    """The run's saved state as ``durably show --json`` prints it."""
    shown = durably("show", run, "--state", state, "--json")
    assert shown.returncode == EXIT["done"], shown.stderr
    return dict(json.loads(shown.stdout))


def test_a_full_or_read_only_state_disk_is_a_clear_error_and_loses_nothing(
    small_disk: Path,
) -> None:
    """On a real disk that is full, then read-only: every command fails with the kernel's
    reason and no traceback, no new run is half made, the checkpoint stays readable, and
    once there is room the run resumes to 16/16 with nothing done twice.
    """
    state = small_disk / "state"
    # The snapshot store: each of its saves needs new pages, so the first save on the full
    # disk fails. A journal append can still land in the slack of its log's last page, so
    # how far a journal run gets on a full disk depends on that slack.
    triage = ("triage", "--task", M1, "--state", state, "--approve", "off", "--store", "snapshot")
    crash = durably(*triage, "--die-after", "code_patch")
    assert crash.returncode == -signal.SIGKILL, crash.stdout + crash.stderr
    run = only_run(state)
    before = saved(state, run)

    ballasts = [fill(small_disk, "ballast-1")]
    full = durably(*triage)
    assert full.returncode == EXIT["failed"], full.stdout + full.stderr
    assert "No space left on device" in full.stderr
    assert "Traceback" not in full.stderr
    after = saved(state, run)
    assert after["phase"] == "tools"
    assert after["turns"] == before["turns"]

    ballasts.append(fill(small_disk, "ballast-2"))  # what the failed resume gave back
    fresh = durably(*triage, "--new")
    assert fresh.returncode == EXIT["failed"], fresh.stdout + fresh.stderr
    assert re.search("No space left on device|database or disk is full", fresh.stderr)
    assert "no run was started" in fresh.stderr
    assert "Traceback" not in fresh.stderr
    assert only_run(state) == run
    assert [p.name for p in (state / "worlds").iterdir()] == [run]

    for ballast in ballasts:
        ballast.unlink()
    resumed = durably(*triage)
    assert resumed.returncode == EXIT["done"], resumed.stdout + resumed.stderr
    assert "16/16 checks passed" in resumed.stdout

    second = durably(*triage, "--new", "--die-after", "code_patch")
    assert second.returncode == -signal.SIGKILL, second.stdout + second.stderr
    (unfinished,) = {f.stem for f in run_files(state)} - {run}
    subprocess.run(["mount", "-o", "remount,ro", small_disk], check=True)
    read_only = durably(*triage)
    assert read_only.returncode == EXIT["failed"], read_only.stdout + read_only.stderr
    assert "Read-only file system" in read_only.stderr
    assert "Traceback" not in read_only.stderr
    assert saved(state, unfinished)["phase"] == "tools"
    refused = durably(*triage, "--new")
    assert refused.returncode == EXIT["failed"], refused.stdout + refused.stderr
    assert "Read-only file system" in refused.stderr
    assert "Traceback" not in refused.stderr
    listed = durably("runs", "--state", state)
    assert listed.returncode == EXIT["done"], listed.stderr
    assert run in listed.stdout
    assert unfinished in listed.stdout


def test_help_shows_the_task_option_with_its_default() -> None:
    """``--task`` is optional and ``--help`` names its default, for triage and sweep alike."""
    for command in ("triage", "sweep"):
        result = durably(command, "--help")

        assert result.returncode == 0, result.stderr
        assert "[--task TASK]" in result.stdout
        assert f"task name (default: {M1})" in " ".join(result.stdout.split())


def test_show_takes_the_start_of_a_run_id_when_only_one_run_starts_so(tmp_path: Path) -> None:
    """``durably show`` resolves a unique start of an ID, prefers a whole ID, and refuses an
    ambiguous start with exit 2 listing every run it starts.
    """
    from durably import Agent, FileStore, Reply, ScriptedModel

    state = tmp_path / "state"
    for run in ("r1", "r10", "beta-7"):
        agent = Agent(
            model=ScriptedModel([Reply(text=f"answer of {run}")]),
            tools=[],
            store=FileStore(state / "runs"),
        )
        agent.run_sync("a task", run_id=run)

    def shown(start: str) -> subprocess.CompletedProcess[str]:
        return durably("show", start, "--state", state, "--json")

    unique, whole, ambiguous, none = shown("bet"), shown("r1"), shown("r"), shown("zz")

    assert unique.returncode == EXIT["done"], unique.stderr
    assert json.loads(unique.stdout)["run_id"] == "beta-7"
    assert whole.returncode == EXIT["done"], whole.stderr
    assert json.loads(whole.stdout)["run_id"] == "r1"
    assert ambiguous.returncode == EXIT["usage"]
    assert "'r' starts 2 run IDs: r1, r10; give more of the ID" in ambiguous.stderr
    assert ambiguous.stdout == ""
    assert none.returncode == EXIT["failed"]
    assert "no run 'zz'" in none.stderr


def test_the_same_command_after_a_finished_run_says_it_starts_a_new_one(state: Path) -> None:
    """Run again once the task's run is done, ``durably triage`` names the finished run and
    the new one it starts, and leaves the finished run as it was.
    """
    first = durably("triage", "--task", M1, "--state", state, "--approve", "off")
    assert first.returncode == EXIT["done"], first.stdout + first.stderr
    finished = only_run(state)
    before = durably("show", finished, "--state", state, "--json").stdout

    again = durably("triage", "--task", M1, "--state", state, "--approve", "off")

    assert again.returncode == EXIT["done"], again.stdout + again.stderr
    (started,) = [run.stem for run in run_files(state) if run.stem != finished]
    assert f"new run {finished} ({M1}," in first.stdout
    assert f"run {finished} is done; starting a new run {started} ({M1}," in again.stdout
    assert durably("show", finished, "--state", state, "--json").stdout == before


def test_show_escapes_control_characters_and_keeps_an_answers_lines_in_its_column(
    tmp_path: Path,
) -> None:
    """A model's answer with a terminal escape (clear the screen) is shown with the escape
    written out, never acted on; its second line stays under the value column.
    """
    from durably import Agent, FileStore, Reply, ScriptedModel

    state = tmp_path / "state"
    agent = Agent(
        model=ScriptedModel([Reply(text="first\x1b[2Jline\nsecond line")]),
        tools=[],
        store=FileStore(state / "runs"),
    )
    agent.run_sync("t", run_id="r1")

    shown = durably("show", "r1", "--state", state)

    assert shown.returncode == EXIT["done"], shown.stderr
    assert "\x1b" not in shown.stdout
    lines = shown.stdout.splitlines()
    at = lines.index("answer      first\\x1b[2Jline")
    assert lines[at + 1] == "            second line"


def test_show_prints_user_and_model_text_as_written(tmp_path: Path) -> None:
    """Text that rich would read as markup or emoji (a task, a model's answer, an error quoting
    a store's path) is printed literally, and a closing tag with no opening one crashes nothing.
    """
    from durably import Agent, FileStore, Reply, ScriptedModel

    state = tmp_path / "state"
    hostile = "fix [/bold] and :bug: [red]now"
    agent = Agent(
        model=ScriptedModel([Reply(text=f"answer: {hostile}")]),
        tools=[],
        store=FileStore(state / "runs"),
    )
    agent.run_sync(hostile, run_id="r1")

    shown = durably("show", "r1", "--state", state)
    odd = tmp_path / "st[/x]ate"
    (odd / "runs").mkdir(parents=True)
    missing = durably("show", "zz", "--state", odd)

    assert shown.returncode == EXIT["done"], shown.stderr
    assert f"task        {hostile}" in shown.stdout
    assert f"answer: {hostile}" in shown.stdout
    assert "🐛" not in shown.stdout
    assert missing.returncode == EXIT["failed"], missing.stderr
    assert f"no run 'zz' in {odd / 'runs'}" in missing.stderr
    assert "Traceback" not in missing.stderr
