"""An OpenAI Agents SDK run through durably's other doors: ``durably resume --agent`` with a
factory that returns ``worker_agent(agent, runner)``, and what ``worker_agent`` refuses.

Crashes are real: a forked child runs the agent under a crash plan that sends it
SIGKILL at a named save point, and the CLI, another process, carries the run on.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _oai_world import build
from agents import Agent

import durably
from _helpers.patience import stretched
from _helpers.refund_world import EMAIL, NOTE, TASK, Service
from durably import faults
from durably.openai_agents import DurableRunner, worker_agent
from durably.sweep import RUN_ID, run_in_child

TESTS = Path(__file__).parent
REFERENCE = {"refund 1042": 1, f"email {EMAIL['to']}: {EMAIL['text']}": 1, f"note {NOTE}": 1}


def _killed_at_the_refund(root: Path) -> None:
    """Run the agent on the file store ``root/runs`` in a child SIGKILLed after the refund acted."""

    def body() -> None:
        service = Service(root / "service")
        service.prepare()
        store = durably.FileStore(root / "runs", sync=False)
        agent, runner = build(store, service, durably.CallLog(root / "model.jsonl"))
        with faults.installed(faults.CrashPlan(label="loop.tool_returned:refund")):
            asyncio.run(runner.run(agent, TASK, run_id=RUN_ID))

    status = run_in_child(body)
    assert os.WIFSIGNALED(status), status
    assert os.WTERMSIG(status) == signal.SIGKILL, status


def _state(root: Path) -> durably.RunState:
    store = durably.FileStore(root / "runs", sync=False)
    try:
        return store.read_sync(RUN_ID)
    finally:
        store.close_sync()


def _cli(*args: str, root: Path) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ,
        "NO_COLOR": "1",
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)]),
        "DURABLY_TEST_ROOT": str(root),
    }
    return subprocess.run(
        [sys.executable, "-m", "durably", *args],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
        timeout=stretched(120),
        env=environment,
    )


@pytest.mark.parametrize("store", [(), ("runs",)])
def test_durably_resume_carries_a_killed_openai_agents_run_on(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    """``durably resume RUN [STORE] --agent MODULE:FACTORY`` with a factory that returns
    ``worker_agent(agent, runner)`` finishes a run killed after its keyed refund acted: each
    effect once, no saved reply asked for again, the restart counted.
    """
    _killed_at_the_refund(tmp_path)
    log = durably.CallLog(tmp_path / "model.jsonl")
    asked = log.turns(RUN_ID)
    service = Service(tmp_path / "service")
    assert service.effects() == {"refund 1042": 1}

    resumed = _cli("resume", RUN_ID, *store, "--agent", "_oai_cli_agents:refunds", root=tmp_path)

    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"done: {RUN_ID}" in resumed.stdout
    assert log.turns(RUN_ID) == [*asked, 3, 4, 5]
    assert log.paid_twice(RUN_ID) == 0
    assert service.effects() == REFERENCE
    assert _state(tmp_path).resumes == 1


def test_durably_resume_names_the_wrapper_a_bare_openai_agents_agent_needs(
    tmp_path: Path,
) -> None:
    """A factory that returns the SDK agent itself is refused with what to wrap it in."""
    _killed_at_the_refund(tmp_path)
    before = _state(tmp_path)

    resumed = _cli("resume", RUN_ID, "runs", "--agent", "_oai_cli_agents:bare", root=tmp_path)

    assert resumed.returncode == 2, resumed.stdout + resumed.stderr
    assert "durably.openai_agents.worker_agent(agent, runner)" in resumed.stderr
    assert Service(tmp_path / "service").effects() == {"refund 1042": 1}
    assert _state(tmp_path).saved_at == before.saved_at


def test_worker_agent_refuses_what_it_cannot_run_durably() -> None:
    """``worker_agent`` of something other than an SDK agent, or without a ``DurableRunner``,
    or with a session that would change what a replayed request holds, is refused.
    """
    runner = DurableRunner(None, default_effect=durably.Effect.WRITE)
    with pytest.raises(TypeError, match=r"takes an agents\.Agent"):
        worker_agent(object(), runner)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="through a DurableRunner"):
        worker_agent(Agent(name="a"), object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no session= or previous_response_id="):
        worker_agent(Agent(name="a"), runner, previous_response_id="r1")


def test_a_runner_with_no_store_says_it_runs_only_on_a_workers_handles() -> None:
    """``DurableRunner(None)`` run directly has nowhere to keep the run: a clear error."""
    runner = DurableRunner(None, default_effect=durably.Effect.WRITE)
    with pytest.raises(ValueError, match=r"store=None\) runs only on the handles a worker"):
        asyncio.run(runner.run(Agent(name="a"), TASK, run_id=RUN_ID))
