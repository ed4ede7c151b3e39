"""A library user sees the ladder: verdicts and approvals are logged, and ``show`` lists them."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import durably
from _helpers.patience import stretched
from durably import Call, Effect, Reply, ToolContext

CHILD = Path(__file__).parent / "_helpers" / "keyed_child.py"


def child(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the refund agent's child process (a user's script configuring no logging)."""
    return subprocess.run(
        [sys.executable, str(CHILD), *args],
        capture_output=True,
        text=True,
        timeout=stretched(120),
        check=False,
    )


def test_a_users_own_agent_prints_its_approvals_and_verdicts_with_no_logging_configured(
    tmp_path: Path,
) -> None:
    """A user's script that configured no logging prints each approval and each ladder verdict
    as one line on stderr, as the demo prints them; nothing else of the loop's INFO log.
    """
    killed = child("run", str(tmp_path), "sends")
    resumed = child("resume", str(tmp_path), "sends")

    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert killed.stderr.splitlines() == ["approval for refund c1: approved"]
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stderr.splitlines() == [
        "in doubt refund c1: ladder step 1 (rerun (harmless)) -> rerun"
    ]


def test_durably_show_lists_the_resolutions_and_approvals_of_a_finished_run(
    tmp_path: Path,
) -> None:
    """``durably show`` of a run that is done still lists how each in-doubt call was settled,
    each approval with who gave it, and the restarts.
    """
    child("run", str(tmp_path), "sends")
    assert child("resume", str(tmp_path), "sends").returncode == 0
    shown = subprocess.run(
        [sys.executable, "-m", "durably", "show", "refund-run", "--state", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=stretched(120),
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )

    assert shown.returncode == 0, shown.stderr
    lines = [" ".join(line.replace("│", " ").split()) for line in shown.stdout.splitlines()]
    assert "phase done" in lines
    assert "restarts 1" in lines
    assert "resolutions (calls found in doubt)" in lines
    assert "c1 refund 1 (rerun (harmless)) rerun - the service still remembers the key" in lines
    assert "approvals" in lines
    assert any(line.startswith("c1 refund yes PolicyApprover 20") for line in lines), lines


class Kept(logging.Handler):
    """Keeps every record it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Keep it."""
        self.records.append(record)


def test_each_verdict_is_one_info_record_of_the_durably_ladder_logger(tmp_path: Path) -> None:
    """A lookup's verdict is one INFO record on ``durably.ladder`` (under ``durably``), with the
    run and call IDs attached, at the logger's default level.
    """
    sent: list[str] = []

    async def find(ctx: ToolContext, note: str) -> durably.Lookup:
        return durably.Found("posted") if sent else durably.NOT_FOUND

    @durably.tool(effect=Effect.WRITE, lookup=find)
    async def post(ctx: ToolContext, note: str) -> str:
        sent.append(note)
        raise durably.ToolInDoubt("sent, no answer")

    agent = durably.Agent(
        model=durably.ScriptedModel(
            [Reply(calls=[Call("c1", "post", '{"note": "hi"}')]), Reply(text="done")]
        ),
        tools=[post],
        store=durably.FileStore(tmp_path),
    )
    kept = Kept()  # a handler at the root, which stays at its default level, WARNING
    logging.getLogger().addHandler(kept)
    try:
        outcome = asyncio.run(agent.run("post hi"))
    finally:
        logging.getLogger().removeHandler(kept)

    assert outcome.status == "done"
    assert logging.getLogger().level == logging.WARNING
    records = [r for r in kept.records if r.name.startswith("durably.ladder")]
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.INFO, "in doubt post c1: ladder step 2 (lookup) -> found")
    ]
    assert (records[0].run_id, records[0].call_id) == (outcome.run_id, "c1")  # type: ignore[attr-defined]
