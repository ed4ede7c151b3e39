"""The bundled tasks: each recorded run, replayed in-process, meets the whole catalog."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from durably import Approver, FileStore, Outcome, PolicyApprover, ScriptedApprover, new_run_id
from durably.state import AssistantMessage, ToolResult
from durably.triage.agent import build_agent
from durably.triage.checks import CHECKS, run_checks
from durably.triage.tracker import normalize_cause
from durably.triage.world import TASKS, World, load_task


@dataclass(frozen=True, kw_only=True)
class Replayed:
    """A task's recorded run, finished, and where it left its traces."""

    outcome: Outcome
    world: World
    store_dir: Path


def replay(tmp_path: Path, task: str, approver: Approver) -> Replayed:
    """Run the task's recording to its end in a fresh world under ``tmp_path``."""
    world = World.create(tmp_path / "world", task)
    store_dir = tmp_path / "runs"
    store = FileStore(store_dir)
    try:
        agent = build_agent(world=world, store=store, approver=approver)
        outcome = asyncio.run(agent.run(load_task(task).description, run_id=new_run_id(task)))
    finally:
        store.close_sync()
    return Replayed(outcome=outcome, world=world, store_dir=store_dir)


def results_of(outcome: Outcome, tool: str) -> list[ToolResult]:
    """The results of every call of ``tool`` the model saw, in order."""
    return [m for m in outcome.state.messages if isinstance(m, ToolResult) and m.name == tool]


@pytest.mark.parametrize("task", TASKS)
def test_recorded_run_finishes_and_passes_all_sixteen_checks(tmp_path: Path, task: str) -> None:
    """Every bundled task's recorded run finishes with an answer and passes every check."""
    replayed = replay(tmp_path, task, PolicyApprover())

    assert replayed.outcome.status == "done", replayed.outcome.stop_reason
    assert replayed.outcome.answer
    checks = run_checks(
        world=replayed.world, state=replayed.outcome.state, store_dir=replayed.store_dir
    )
    assert len(checks) == len(CHECKS) == 16
    failing = [f"{c.name}: {c.reason}" for c in checks if not c.ok]
    assert not failing, "\n".join(failing)


def test_m2_refiling_is_refused_and_the_model_sees_the_existing_issue(tmp_path: Path) -> None:
    """In m2 the tracker refuses the second filing for a filed cause and names issue #1."""
    task = load_task("m2-due-date-zulu")
    replayed = replay(tmp_path, task.name, PolicyApprover())
    tracker = replayed.world.tracker()

    filings = [(r.outcome, r.target) for r in tracker.requests() if r.operation == "file_issue"]
    assert filings == [("created", 1), ("already_filed", 1)]
    assert [(i.number, i.cause) for i in tracker.issues()] == [
        (1, normalize_cause(task.groups[0].cause))
    ]
    first, second = results_of(replayed.outcome, "file_issue")
    assert not first.is_error
    assert second.is_error
    assert "#1" in second.content
    assert "already filed" in second.content


@pytest.mark.parametrize("task", ["m1-done-after-delete", "m3-unicode-export"])
def test_every_filing_is_put_to_the_approver(tmp_path: Path, task: str) -> None:
    """In m1 and m3 the approver is asked once per filing, one filing per cause."""
    approver = ScriptedApprover()
    replayed = replay(tmp_path, task, approver)

    groups = load_task(task).groups
    assert len(approver.approvals) == len(groups) > 1
    assert {a.tool for a in approver.approvals} == {"file_issue"}
    assert approver.resolutions == []
    filing_calls = [
        call.id
        for message in replayed.outcome.state.messages
        if isinstance(message, AssistantMessage)
        for call in message.calls
        if call.name == "file_issue"
    ]
    assert [a.call_id for a in approver.approvals] == filing_calls
    causes = Counter(i.cause for i in replayed.world.tracker().issues())
    assert causes == Counter(normalize_cause(g.cause) for g in groups)
