"""A durable-execution peer beside durably, both SIGKILLed inside a tool at the same moments.

Each adapter's comparison (tests/pydantic_ai/test_pydantic_ai_dbos.py,
tests/openai_agents/test_openai_agents_dbos.py) runs one agent under a peer system
and under durably, in processes started from a script of its own: ``SCRIPT SYSTEM
ROOT PHASE [KILL_AT]``, printing ``{"answer": ...}`` as its last line. The service
the agent acts on calls :func:`kill_once` right after an effect it was told to
kill at: the moment neither system has recorded the tool's result. The table of
what each system did is kept in tests/testdata and compared with
:func:`check_reference`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _helpers.patience import stretched


def kill_once(root: Path) -> None:
    """SIGKILL this process, the first time any process of the world ``root`` gets here."""
    armed = root / "killed"
    if not armed.exists():
        armed.touch()
        os.kill(os.getpid(), signal.SIGKILL)


def run_peer(
    script: Path, system: str, root: Path, phase: str, *kill_at: str
) -> subprocess.CompletedProcess[str]:
    """One process of ``script``: ``system`` in the world ``root``, ``phase`` run or resume."""
    return subprocess.run(
        [sys.executable, str(script), system, str(root), phase, *kill_at],
        capture_output=True,
        text=True,
        timeout=stretched(300),
        check=False,
    )


def killed_then_resumed(
    script: Path, system: str, root: Path, kill_at: str, *, answer: str, armed: Path | None = None
) -> None:
    """Start the run, see it die by SIGKILL at ``kill_at``, carry it on to ``answer``.

    ``armed`` is the directory :func:`kill_once` was given (``root`` by default).
    """
    first = run_peer(script, system, root, "run", kill_at)
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert ((armed or root) / "killed").exists()
    second = run_peer(script, system, root, "resume")
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout.splitlines()[-1]) == {"answer": answer}


def check_reference(text: str, reference: Path) -> None:
    """Print the table (shown with -s), rewrite it under DURABLY_REGENERATE, compare it."""
    print(text)
    if os.environ.get("DURABLY_REGENERATE"):
        reference.write_text(text)
    assert text == reference.read_text()


async def run_dbos_workflow(
    root: Path, phase: str, run_id: str, task: str, workflow: Callable[[str], Awaitable[str]]
) -> str:
    """Launch DBOS on ``root``'s SQLite database; ``run`` starts ``workflow`` under ``run_id``,
    ``resume`` waits for the workflow DBOS recovered at launch. ``workflow`` is already a
    ``DBOS.workflow()``.
    """
    from dbos import DBOS, SetWorkflowID

    DBOS(
        config={
            "name": "refunds",
            "system_database_url": f"sqlite:///{root / 'dbos.sqlite'}",
            "log_level": "WARNING",
        }
    )
    DBOS.launch()  # recovers this executor's pending workflows, in the background
    try:
        if phase == "run":
            with SetWorkflowID(run_id):
                return await workflow(task)
        handle: Any = await DBOS.retrieve_workflow_async(run_id)
        return str(await handle.get_result())
    finally:
        DBOS.destroy()
