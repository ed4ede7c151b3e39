"""One grammar for every command (issue 39, item 3): options anywhere, one answer to a missing
store, a command's own usage with its errors, and a busy console port named with its fix.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from _helpers.patience import stretched
from durably.cli import EXIT

ENV = {**os.environ, "COLUMNS": "200"}
ENV.pop("DURABLY_DSN", None)


def durably(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The ``durably`` command in its own process."""
    return subprocess.run(
        [sys.executable, "-m", "durably", *map(str, args)],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=stretched(120),
        check=False,
    )


def test_a_store_after_an_option_is_the_store_not_an_unrecognized_argument(
    tmp_path: Path,
) -> None:
    """``answer RUN CALL no --reason TEXT STORE``: STORE is read as the store (here: missing)."""
    missing = tmp_path / "nowhere"
    result = durably("answer", "r1", "c1", "no", "--reason", "too much", missing, cwd=tmp_path)
    assert result.returncode == EXIT["usage"], result.stderr
    assert "unrecognized arguments" not in result.stderr
    assert f"no store at {missing}" in result.stderr


def test_an_unknown_word_is_an_error_under_the_commands_own_usage(tmp_path: Path) -> None:
    """The usage shown is the one of the command typed, not ``durably [-h] COMMAND``."""
    result = durably("answer", "r1", "c1", "no", tmp_path, "--bogus", cwd=tmp_path)
    assert result.returncode == EXIT["usage"]
    assert "usage: durably answer" in result.stderr
    assert "durably answer: error: unrecognized arguments: --bogus" in result.stderr


@pytest.mark.parametrize("command", [["runs"], ["pending"], ["show", "r1"]])
def test_every_command_answers_a_missing_store_with_the_same_exit_code(
    tmp_path: Path, command: list[str]
) -> None:
    """A mistyped store is a usage error everywhere (``runs`` said 0 with an empty table;
    ``show`` took no STORE at all).
    """
    result = durably(*command, tmp_path / "nowhere", cwd=tmp_path)
    assert result.returncode == EXIT["usage"], result.stdout + result.stderr
    assert str(tmp_path / "nowhere") in result.stderr
    assert "does not exist" in result.stderr
    assert "unrecognized arguments" not in result.stderr
    assert not (tmp_path / "nowhere").exists()


def test_show_reads_a_store_given_as_a_directory_as_the_other_commands_do(
    tmp_path: Path,
) -> None:
    """``show RUN STORE`` reads the directory a FileStore was given, with options before or
    after it; ``--state DIR`` still reads ``DIR/runs``.
    """
    from durably import Agent, FileStore, Reply, ScriptedModel

    store = tmp_path / "my-store"
    agent = Agent(model=ScriptedModel([Reply(text="ok")]), tools=[], store=FileStore(store))
    agent.run_sync("a task", run_id="r1")
    (tmp_path / "demo").mkdir()
    store.rename(tmp_path / "demo" / "runs")
    moved = tmp_path / "demo" / "runs"

    text = durably("show", "r1", moved, cwd=tmp_path)
    first = durably("show", "--json", "r1", moved, cwd=tmp_path)
    last = durably("show", "r1", moved, "--json", cwd=tmp_path)
    state = durably("show", "r1", "--state", tmp_path / "demo", "--json", cwd=tmp_path)

    assert text.returncode == EXIT["done"], text.stderr
    assert text.stdout.splitlines()[0] == "r1"
    assert "task        a task" in text.stdout
    for result in (first, last, state):
        assert result.returncode == EXIT["done"], result.stderr
        assert json.loads(result.stdout)["run_id"] == "r1"


def test_a_console_port_in_use_names_the_port_and_the_option(tmp_path: Path) -> None:
    """Not ``[Errno 98] Address already in use``: which port, and ``--port`` to choose another."""
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o700)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = durably("console", runs, "--port", str(port), cwd=tmp_path)
    assert result.returncode == EXIT["usage"], result.stdout + result.stderr
    assert f"port {port} on 127.0.0.1 is in use" in result.stderr
    assert "--port N" in result.stderr
