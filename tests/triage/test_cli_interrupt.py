"""Ctrl-C and an approver nobody can answer: the run stops at once, saved, with its exit code."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from _helpers.patience import stretched
from _helpers.terminal import on_a_terminal
from durably.cli import EXIT

M1 = "m1-done-after-delete"
APPROVAL_PROMPT = b"[y]es / [n]o: "
ENV = {**os.environ, "COLUMNS": "200", "PYTHONFAULTHANDLER": "1"}
"""``PYTHONFAULTHANDLER``: a child aborted because it did not exit prints where it was."""


def read_pty_until(fd: int, wanted: bytes, timeout: float) -> bytes:
    """Read a pseudo-terminal's output until ``wanted`` shows; fail on its end or a timeout."""
    seen = b""
    deadline = time.monotonic() + timeout
    while wanted not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {wanted!r} within {timeout}s; output so far:\n{seen.decode()}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                chunk = b""
            assert chunk, f"the terminal closed before {wanted!r}; output:\n{seen.decode()}"
            seen += chunk
    return seen


def wait_exit(pid: int, timeout: float, fd: int | None = None) -> int | None:
    """The child's exit code (negative for a signal), or None if it is still running.

    With ``fd`` (the pseudo-terminal), its output is read and dropped meanwhile, as a
    terminal would: a child writing more than the terminal buffers would otherwise
    block in ``write`` and never exit.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if fd is None:
            time.sleep(0.01)
            continue
        ready, _, _ = select.select([fd], [], [], 0.01)
        if ready:
            with contextlib.suppress(OSError):  # EIO: the child closed the terminal
                os.read(fd, 65536)
    return None


def abort_showing_stacks(pid: int, fd: int) -> str:
    """Abort a child that did not exit and return the end of what it printed since.

    SIGABRT makes the child's faulthandler (``PYTHONFAULTHANDLER``) print every thread's
    stack to its terminal, which names what it was waiting for; then it is killed.
    """
    facts = [_signal_facts(pid), _terminal_facts(pid, fd)]
    os.kill(pid, signal.SIGABRT)
    printed = b""
    deadline = time.monotonic() + stretched(5)
    exited = False
    while not exited and time.monotonic() < deadline:
        exited = os.waitpid(pid, os.WNOHANG)[0] != 0
        if select.select([fd], [], [], 0.05)[0]:
            with contextlib.suppress(OSError):  # EIO: the child closed the terminal
                printed += os.read(fd, 65536)
    if not exited:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return "\n".join([*facts, printed.decode(errors="replace")[-6000:]])


def _signal_facts(pid: int) -> str:
    """The child's signal masks as the kernel has them (pending, blocked, ignored, caught)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError as exc:
        return f"no /proc status: {exc}"
    wanted = ("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
    masks = "; ".join(line for line in status if line.startswith(wanted))
    return f"child signals (SIGINT is bit 1, 0x2): {masks}"


def _terminal_facts(pid: int, fd: int) -> str:
    """Whether the terminal turns Ctrl-C into SIGINT, and for which process group."""
    try:
        isig = bool(termios.tcgetattr(fd)[3] & termios.ISIG)
        return (
            f"terminal: ISIG {isig}, foreground group {os.tcgetpgrp(fd)}, child's {os.getpgid(pid)}"
        )
    except OSError as exc:
        return f"terminal: unreadable ({exc})"


def saved_state(state: Path) -> dict[str, object]:
    """The one run's checkpoint as ``durably show --json`` prints it."""
    (run,) = [p.name for p in (state / "worlds").iterdir()]
    shown = subprocess.run(
        [sys.executable, "-m", "durably", "show", run, "--state", str(state), "--json"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=stretched(60),
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    loaded: dict[str, object] = json.loads(shown.stdout)
    return loaded


@pytest.mark.slow
def test_ctrl_c_at_the_approval_prompt_exits_130_at_once_with_the_run_saved_paused(
    tmp_path: Path,
) -> None:
    """Ctrl-C typed at the approval prompt (SIGINT from a real terminal) ends the process
    at once (within a second on a quiet machine) with exit 130, and the run is saved paused
    on that question.
    """
    state = tmp_path / "state"
    argv = [sys.executable, "-m", "durably", "triage", "--task", M1, "--state", str(state)]
    argv += ["--model", "replay"]
    pid, fd = on_a_terminal(argv, ENV)
    code: int | None = None
    hung = ""
    try:
        read_pty_until(fd, APPROVAL_PROMPT, timeout=stretched(60))
        time.sleep(0.2)  # the prompt is written just before the read starts waiting
        typed = time.monotonic()
        os.write(fd, b"\x03")  # the terminal's interrupt character: SIGINT to the foreground
        code = wait_exit(pid, timeout=stretched(5), fd=fd)
        took = time.monotonic() - typed
    finally:
        if code is None:  # still running (or the test failed before): do not leave it behind
            hung = abort_showing_stacks(pid, fd)
        os.close(fd)

    assert code == 130, f"no exit after Ctrl-C; where it was:\n{hung}"
    assert took < stretched(1.0), f"exit took {took:.2f}s after Ctrl-C"
    saved = saved_state(state)
    assert saved["phase"] == "paused"
    pending = saved["pending"]
    assert isinstance(pending, dict)
    assert [q["tool"] for q in pending.values()] == ["file_issue"]


@pytest.mark.slow
@pytest.mark.parametrize("stdin", ["end-of-input", "closed"])
def test_an_approver_nobody_can_answer_leaves_the_run_paused_with_exit_3(
    tmp_path: Path, stdin: str
) -> None:
    """With stdin at its end or closed, ``--approve on`` leaves the run paused (exit 3), and a
    second try does not count a restart.
    """
    state = tmp_path / "state"
    argv = [sys.executable, "-m", "durably", "triage", "--task", M1, "--state", str(state)]
    argv += ["--model", "replay"]

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv,
            stdin=subprocess.DEVNULL if stdin == "end-of-input" else None,
            # Closing fd 0 in the child leaves Python with no sys.stdin at all.
            preexec_fn=(lambda: os.close(0)) if stdin == "closed" else None,
            capture_output=True,
            text=True,
            env=ENV,
            timeout=stretched(120),
            check=False,
        )

    first, second = run(), run()

    for result in (first, second):
        assert result.returncode == EXIT["paused"], result.stdout + result.stderr
        assert "nobody to ask about file_issue" in result.stdout
    saved = saved_state(state)
    assert (saved["phase"], saved.get("resumes", 0)) == ("paused", 0)


@pytest.mark.slow
def test_max_resumes_on_the_command_line_stops_a_restart_and_a_higher_one_goes_on(
    tmp_path: Path,
) -> None:
    """``--max-resumes 0`` stops the restart of a crashed run with exit 5 and says how to go
    on; the default then carries it to 16/16; a negative count is bad usage.
    """
    state = tmp_path / "state"
    base = [sys.executable, "-m", "durably", "triage", "--task", M1, "--state", str(state)]
    base += ["--approve", "off"]

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*base, *extra],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=ENV,
            timeout=stretched(120),
            check=False,
        )

    assert run("--max-resumes", "-1").returncode == EXIT["usage"]
    assert run("--die-after", "code_patch").returncode == -signal.SIGKILL
    stopped = run("--max-resumes", "0")
    assert stopped.returncode == EXIT["limit"], stopped.stdout + stopped.stderr
    assert "restarted 1 time, past max_resumes=0" in stopped.stderr
    assert "durably triage --max-resumes N" in stopped.stderr
    finished = run()
    assert finished.returncode == EXIT["done"], finished.stdout + finished.stderr
    assert "16/16 checks passed" in finished.stdout


@pytest.mark.slow
def test_ctrl_c_during_a_model_call_exits_130_at_once_with_the_call_marked(
    tmp_path: Path,
) -> None:
    """Ctrl-C while the model is thinking (a provider that accepted the request and has not
    answered) ends the process at once with exit 130; the saved state has the
    model-call marker, which the next resume counts.
    """
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    state = tmp_path / "state"
    argv = [sys.executable, "-m", "durably", "triage", "--task", M1, "--state", str(state)]
    argv += ["--model", "anthropic", "--approve", "off"]
    env = {**ENV, "ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}"}
    pid, fd = on_a_terminal(argv, env)
    code: int | None = None
    hung = ""
    try:
        server.settimeout(60)
        connection, _ = server.accept()  # the request is on its way: the call is in flight
        time.sleep(0.3)
        typed = time.monotonic()
        os.write(fd, b"\x03")
        code = wait_exit(pid, timeout=stretched(5), fd=fd)
        took = time.monotonic() - typed
        connection.close()
    finally:
        if code is None:
            hung = abort_showing_stacks(pid, fd)
        os.close(fd)
        server.close()

    assert code == 130, f"no exit after Ctrl-C; where it was:\n{hung}"
    assert took < stretched(1.0), f"exit took {took:.2f}s after Ctrl-C"
    saved = saved_state(state)
    assert saved.get("phase", "model") == "model"
    model_call = saved["model_call"]
    assert isinstance(model_call, dict)
    assert (model_call["turn"], model_call["worst_dollars"] > 0) == (1, True)
