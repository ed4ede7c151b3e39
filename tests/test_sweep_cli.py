"""What ``durably sweep`` shows a person: a steady bar, a table for 80 columns, a verdict line,
children's warnings counted instead of scrolling over the bar, and what ran when it is stopped.

Each test runs the real command in a child process (on a pseudo-terminal where the bar
matters), on one small configuration.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _helpers.mutants import ENV
from _helpers.patience import stretched
from _helpers.terminal import on_a_terminal

TESTS = Path(__file__).parent
SITE = TESTS / "_helpers" / "mutant_site"
HEADERS = ("configuration", "d", "scen", "points", "fin", "dup", "lost", "asked", "paid2", "chk")
HANG_GUARD = stretched(900)  # seconds: a hang guard, far beyond a loaded machine's worst
SWEEP = (sys.executable, "-m", "durably", "sweep", "--jobs", "2")


def _sweep(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SWEEP, *args],
        env={**os.environ, "COLUMNS": "80", **(env or {})},
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        check=False,
    )


def _on_a_terminal(*args: str) -> tuple[int, int]:
    """Start the sweep on a pseudo-terminal 80 columns wide: its pid and the terminal's fd."""
    return on_a_terminal([*SWEEP, *args], {**os.environ, "COLUMNS": "80"})


def _read(fd: int, until: re.Pattern[bytes] | None = None) -> bytes:
    """What the terminal shows until ``until`` matches (or the command ends, without)."""
    seen = b""
    deadline = time.monotonic() + HANG_GUARD
    while until is None or not until.search(seen):
        left = deadline - time.monotonic()
        assert left > 0, f"nothing like {until!r} in {HANG_GUARD}s; so far:\n{seen.decode()}"
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the command closed the terminal
            chunk = b""
        if not chunk:
            assert until is None, f"the command ended before {until!r}:\n{seen.decode()}"
            return seen
        seen += chunk
    return seen


def _plain(shown: bytes) -> str:
    """A terminal's output as text: no colours or cursor moves, lines ended by newlines."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown.decode(errors="replace"))
    return text.replace("\r\n", "\n")


def _verdict(shown: str) -> str:
    """The verdict line, unwrapped (it goes on in lines indented by two spaces)."""
    lines = shown.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.startswith("verdict:")]
    end = at + 1
    while end < len(lines) and lines[end].startswith("  "):
        end += 1
    return " ".join(line.strip() for line in lines[at:end])


def _exit_code(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_the_table_fits_80_columns_with_whole_headers_a_legend_and_a_clean_verdict() -> None:
    """At COLUMNS=80 no header is cut, no line is wider, every abbreviation is explained, and
    the verdict says the protected row is clean and the baseline failed, with its counts.
    """
    done = _sweep("--depth", "1", "--config", "keys honoured", "--config", "naive retry")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "…" not in done.stdout
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    header = next(line for line in lines if line.startswith("configuration"))
    assert tuple(header.split()) == (*HEADERS, "err")
    legend = " ".join(done.stdout.split())
    for abbreviation in ("d depth", "scen scenarios", "fin finished", "dup duplicate effects"):
        assert abbreviation in legend
    assert "paid2 saved replies paid for twice" in legend
    assert "(b) a baseline" in legend
    naive = next(line for line in lines if line.startswith("naive retry (b)"))
    duplicates = int(naive.split()[7])
    assert duplicates > 0
    verdict = _verdict(done.stdout)
    assert verdict.startswith(
        "verdict: clean — 1 protected row with no duplicate, loss, reply paid twice or failed "
        f"check; 1 baseline failed as they must (naive retry: {duplicates} duplicates"
    ), verdict


def test_a_broken_run_gets_a_verdict_that_names_what_is_wrong() -> None:
    """Under a seeded flaw (a saved reply dropped on resume) the verdict is NOT CLEAN and
    names the row and what it showed; the command fails.
    """
    done = _sweep(
        "--depth",
        "1",
        "--config",
        "keys honoured",
        env={ENV: "saved reply dropped on resume", "PYTHONPATH": f"{SITE}{os.pathsep}{TESTS}"},
    )
    assert done.returncode == 1, done.stderr
    verdict = _verdict(done.stdout)
    assert verdict.startswith("verdict: NOT CLEAN — keys honoured (depth 1): "), verdict
    assert "replies paid twice" in verdict, verdict


def test_children_warnings_are_counted_at_the_end_not_shown_over_the_bar() -> None:
    """The scenarios' "reply was lost before its save" warnings never reach the terminal; the
    end says how many there were, and of which kind.
    """
    pid, fd = _on_a_terminal("--depth", "1", "--config", "keys honoured")
    shown = _plain(_read(fd))
    assert _exit_code(pid) == 0, shown
    counted = re.search(r"children's warnings: (\d+) \(counted, not shown\)", shown)
    assert counted, shown
    assert int(counted[1]) > 0
    kind = re.search(r"(\d+) x turn N's reply was lost before its save", shown)
    assert kind, shown
    assert int(kind[1]) <= int(counted[1])
    assert "children's other output" not in shown  # not even the bar, drawn again by a fork
    # Every other mention of the warning is gone: only the summary's line names it.
    assert shown.count("reply was lost before its save") == len(
        re.findall(r"\d+ x turn N's reply was lost", shown)
    )


def test_sigterm_prints_what_ran_marked_partial_and_fails() -> None:
    """SIGTERM during the sweep: the rows so far, a partial verdict, no report file, exit 143;
    no worker or scenario process outlives the command for long.
    """
    pid, fd = _on_a_terminal("--depth", "2", "--config", "keys honoured")
    # The bar has counted a batch of first crashes: scenarios have been judged.
    _read(fd, until=re.compile(rb"[1-9]\d*/\d+"))
    os.kill(pid, signal.SIGTERM)
    shown = _plain(_read(fd))
    assert _exit_code(pid) == 128 + signal.SIGTERM, shown
    assert "(partial: stopped by SIGTERM)" in shown
    verdict = re.search(
        r"verdict: partial — stopped by SIGTERM after (\d+) of (\d+) first", _verdict(shown)
    )
    assert verdict, shown
    assert 0 < int(verdict[1]) < int(verdict[2])
    row = re.search(r"keys honoured +1 +(\d+)", shown)
    assert row, shown
    assert int(row[1]) > 0
    assert "not written for a partial sweep" in shown
    # The workers stop with it: none of its session's processes is left running.
    deadline = time.monotonic() + HANG_GUARD
    while _in_session(pid):
        assert time.monotonic() < deadline, f"left running: {_in_session(pid)}"
        time.sleep(0.5)


def _in_session(session: int) -> list[int]:
    """Processes still in the session the command led (its workers, their children)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == session:
                    found.append(int(entry.name))
            except OSError:  # gone meanwhile
                continue
    return found


@pytest.mark.skipif(shutil.which("strace") is None, reason="the system-call sweep needs strace")
def test_the_system_call_sweeps_children_warnings_are_counted_not_printed() -> None:
    """`--syscalls --depth 2`: each traced child's "reply was lost" warnings are in the count
    at the end, not on the terminal one by one (they scrolled over the progress line).
    """
    done = _sweep(
        *("--syscalls", "--depth", "2", "--sample", "3", "--stores", "snapshot"),
    )
    assert done.returncode == 0, done.stderr
    shown = done.stdout + done.stderr
    mentions = [line for line in shown.splitlines() if "was lost before its save" in line]
    assert mentions, shown[-3000:]
    assert all(re.match(r"^ +\d+ x turn N's reply was lost", line) for line in mentions), mentions
    counted = re.search(r"children's warnings: (\d+) \(counted, not shown\)", shown)
    assert counted, shown[-3000:]
    assert int(counted[1]) > 0
