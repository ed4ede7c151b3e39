"""durably.openai_agents: an Agents SDK run through ``DurableRunner`` keeps durably's promise.

Crashes are real: a forked child runs the agent under a crash plan that sends it
SIGKILL at a named save point, and the test process carries the run on.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _oai_world import build

import durably
from _helpers.patience import stretched
from _helpers.refund_world import ANSWER, NOTE, TASK, Service
from durably import faults
from durably.engine import Save, SavePoint
from durably.openai_agents import DurableRunner, ReplayDiverged, tool_context
from durably.state import AssistantMessage, ToolResult
from durably.sweep import RUN_ID, Config, run_in_child

LocalStore = durably.FileStore | durably.JournalStore

STORES: dict[str, Callable[[Path], LocalStore]] = {
    "file": lambda root: durably.FileStore(root / "runs", sync=False),
    "journal": lambda root: durably.JournalStore(root / "runs", sync=False),
}


class Place:
    """One test's world: a store directory, the service and the model's call log."""

    def __init__(self, root: Path, store: str = "file", **service: object) -> None:
        self.root, self.store_kind = root, store
        self.service = Service(root / "service", **service)  # type: ignore[arg-type]
        self.service.prepare()
        self.log = durably.CallLog(root / "model.jsonl")

    def store(self) -> LocalStore:
        """A new store over the world's run directory (each process opens its own)."""
        return STORES[self.store_kind](self.root)

    def agent(self, **options: object) -> tuple[Any, DurableRunner]:
        """The agent, built anew as a restarted process builds it."""
        return build(self.store(), self.service, self.log, **options)  # type: ignore[arg-type]

    def run(self, **options: object) -> object:
        """``DurableRunner.run`` of the task under the run ID, in this process."""
        agent, runner = self.agent(**options)
        return asyncio.run(runner.run(agent, TASK, run_id=RUN_ID))

    def resume(self, **options: object) -> object:
        """``DurableRunner.resume`` of the run, in this process."""
        agent, runner = self.agent(**options)
        return asyncio.run(runner.resume(agent, RUN_ID))

    def killed_at(self, label: str, occurrence: int = 1, **options: object) -> None:
        """Start the run in a child that SIGKILLs itself at ``label``; assert it died so."""

        def body() -> None:
            with faults.installed(faults.CrashPlan(label=label, occurrence=occurrence)):
                self.run(**options)

        status = run_in_child(body)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        assert killed, f"the child was not killed at {label} (wait status {status})"

    def state(self) -> durably.RunState:
        """The run's saved state."""
        store = self.store()
        try:
            return store.read_sync(RUN_ID)
        finally:
            store.close_sync()


class Person:
    """Someone who checks the service when asked about an in-doubt call."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.asked: list[str] = []

    async def approve(self, request: durably.ApprovalRequest) -> durably.Yes:
        """Yes to every call."""
        return durably.Yes()

    async def resolve(self, request: durably.ResolveRequest) -> durably.Rerun | durably.Done:
        """Done when the note is there, else rerun."""
        self.asked.append(request.tool)
        noted = any(e["text"] == NOTE for e in self.service.lines("notes"))
        return durably.Done("noted (checked)") if noted else durably.Rerun()


REFERENCE = {
    "refund 1042": 1,
    "email a@b.c: order 1042 is refunded": 1,
    f"note {NOTE}": 1,
}


def test_a_run_finishes_and_a_finished_run_pays_for_nothing_again(tmp_path: Path) -> None:
    """A finished run carried on again asks the model nothing and calls no tool."""
    place = Place(tmp_path)
    first = place.run()
    asked = place.log.turns(RUN_ID)

    again = place.resume()

    assert first.final_output == again.final_output == ANSWER  # type: ignore[attr-defined]
    assert asked == [1, 2, 3, 4, 5]  # the fifth reply is the closer's, after the handoff
    assert place.log.turns(RUN_ID) == asked
    assert place.service.effects() == REFERENCE
    assert place.state().phase is durably.Phase.DONE


@pytest.mark.parametrize("store", sorted(STORES))
@pytest.mark.parametrize(
    ("point", "occurrence"),
    [
        (SavePoint.START.crash_point, 1),
        (Save.MODEL_CALL.crash_point, 1),
        ("loop.reply_received", 1),
        (SavePoint.REPLY.crash_point, 1),
        (SavePoint.ATTEMPT.crash_point, 1),
        ("loop.tool_returned:refund", 1),
        ("loop.tool_returned:post_note", 1),
        (SavePoint.RESULT.crash_point, 1),
        # After the handoff's reply (the fourth) and in the closer's turn (the fifth).
        (SavePoint.REPLY.crash_point, 4),
        (SavePoint.RESULT.crash_point, 5),
        (Save.MODEL_CALL.crash_point, 5),
        ("loop.reply_received", 5),
    ],
)
def test_a_run_killed_at_a_save_point_finishes_with_every_effect_once(
    tmp_path: Path, store: str, point: str, occurrence: int
) -> None:
    """Killed by SIGKILL at a save point (the first of each; the sweep kills at every one),
    the run resumed does each effect once and asks the model again only for a reply it had
    not saved.
    """
    place = Place(tmp_path, store=store)
    place.killed_at(point, occurrence)
    saved_turns = place.state().turns
    asked = len(place.log.turns(RUN_ID))
    person = Person(place.service)

    place.resume(approver=person)

    later = place.log.turns(RUN_ID)[asked:]
    assert [t for t in later if t <= saved_turns] == []  # no saved reply paid for twice
    assert place.service.effects() == REFERENCE
    assert place.state().answer == ANSWER
    # Only the note, a write with neither key nor lookup, may need a person.
    assert set(person.asked) <= {"post_note"}
    assert person.asked == (["post_note"] if point == "loop.tool_returned:post_note" else [])
    handoffs = [m for m in place.state().messages if isinstance(m, ToolResult)]
    assert [m.name for m in handoffs].count("transfer_to_closer") == 1


def test_the_key_is_derived_from_the_run_and_the_call_and_never_in_the_arguments(
    tmp_path: Path,
) -> None:
    """The refund's key is ``idempotency_key(run ID, tool_call_id)``, reached through
    ``tool_context()``, and the model's arguments carry no key.
    """
    place = Place(tmp_path)
    place.run()
    (refund,) = place.service.lines("refunds")
    reply = next(
        m
        for m in place.state().messages
        if isinstance(m, AssistantMessage) and any(c.name == "refund" for c in m.calls)
    )
    (call,) = reply.calls

    assert refund["key"] == durably.idempotency_key(RUN_ID, call.id)
    assert refund["key"] not in call.arguments
    with pytest.raises(RuntimeError, match="outside a tool call"):
        tool_context()


def test_each_side_effecting_call_has_its_own_marker_saved_before_it_runs(
    tmp_path: Path,
) -> None:
    """When a write runs, its attempt marker is on disk already, each parallel call its own."""
    place = Place(tmp_path)
    seen: dict[str, set[str]] = {}
    real = place.service._append  # noqa: SLF001 - the test watches the service's one write path

    def watched(name: str, record: dict[str, object]) -> None:
        seen[name] = set(place.state().markers)
        real(name, record)

    place.service._append = watched  # type: ignore[method-assign]  # noqa: SLF001
    place.run()
    calls = {
        c.name: c.id
        for m in place.state().messages
        if isinstance(m, AssistantMessage)
        for c in m.calls
    }

    assert calls["refund"] in seen["refunds"]
    # send_email and post_note run as parallel tasks: each has its own marker.
    assert calls["send_email"] in seen["emails"]
    assert calls["post_note"] in seen["notes"]
    assert calls["get_order"] not in seen["refunds"] | seen["emails"] | seen["notes"]
    assert place.state().markers == {}


def test_a_tool_that_declares_no_effect_is_refused_before_the_model_is_asked(
    tmp_path: Path,
) -> None:
    """A tool ``effects`` does not name, and no default, stops the run before any call."""
    from agents import function_tool

    place = Place(tmp_path)
    agent, runner = place.agent()

    @function_tool
    async def unsure(order: str) -> str:
        """Do something to an order."""
        return order

    bare = agent.clone(tools=[*agent.tools, unsure])
    with pytest.raises(ValueError, match="tool 'unsure' declares no effect"):
        asyncio.run(runner.run(bare, TASK, run_id=RUN_ID))
    assert place.log.turns(RUN_ID) == []


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durably", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=stretched(120),
        env={**os.environ, "NO_COLOR": "1"},
    )


def test_an_in_doubt_write_without_a_lookup_waits_for_durably_answer(tmp_path: Path) -> None:
    """A note the service took without answering pauses the run the SDK's way (the result's
    interruptions) with the question saved; ``durably pending`` lists it, ``durably answer
    ... done`` settles it, and the resumed run finishes without posting the note again or
    asking the model for a saved reply.
    """
    place = Place(tmp_path, doubt=frozenset({"notes"}))
    paused = place.run()
    (call_id,) = [item.call_id for item in paused.interruptions]  # type: ignore[attr-defined]
    question = place.state().pending[call_id]
    assert question.tool == "post_note"
    assert place.state().phase is durably.Phase.PAUSED

    listed = _cli("pending", "runs", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert question.call_id in listed.stdout
    answered = _cli(
        "answer", RUN_ID, question.call_id, "done", "runs", "--result", "noted", cwd=tmp_path
    )
    assert answered.returncode == 0, answered.stderr

    asked = place.log.turns(RUN_ID)
    place.service.doubt = frozenset()
    place.resume()

    assert place.log.turns(RUN_ID) == [*asked, 4, 5]
    assert place.service.effects() == REFERENCE
    assert place.state().answer == ANSWER
    assert place.state().resumes == 0  # a person answering is not a restart


class Away:
    """An approver nobody is at: every question waits for ``durably answer``."""

    async def approve(self, request: durably.ApprovalRequest) -> object:
        """Nobody can say yes now: ask later."""
        return durably.DEFER

    async def resolve(self, request: durably.ResolveRequest) -> object:
        """Nobody can tell now: ask later."""
        return durably.DEFER


@pytest.mark.parametrize(("word", "notes"), [("yes", 1), ("no", 0)])
def test_a_call_needing_approval_waits_for_durably_answer_yes_or_no(
    tmp_path: Path, word: str, notes: int
) -> None:
    """A note that needs approval pauses the run before it runs, no marker saved; answered
    yes it is posted once, answered no it never is and the model is told why.
    """
    place = Place(tmp_path)
    paused = place.run(approver=Away(), approval=frozenset({"post_note"}))
    (call_id,) = [item.call_id for item in paused.interruptions]  # type: ignore[attr-defined]
    assert place.state().markers == {}
    assert place.service.lines("notes") == []

    extra = ["--reason", "not today"] if word == "no" else []
    answered = _cli("answer", RUN_ID, call_id, word, "runs", *extra, cwd=tmp_path)
    assert answered.returncode == 0, answered.stderr
    place.resume(approver=Away(), approval=frozenset({"post_note"}))

    assert len(place.service.lines("notes")) == notes
    assert len(place.service.lines("refunds")) == 1
    result = next(
        m for m in place.state().messages if isinstance(m, ToolResult) and m.call_id == call_id
    )
    assert result.is_error == (word == "no")
    assert place.state().answer == ANSWER


def test_the_restart_limit_counts_every_killed_process(tmp_path: Path) -> None:
    """With max_resumes=0 a run killed once stops on its first restart, saved; a higher
    limit carries it on with each effect once.
    """
    place = Place(tmp_path)
    place.killed_at(SavePoint.ATTEMPT.crash_point)

    with pytest.raises(durably.MaxResumes):
        place.resume(limits=durably.Limits(max_resumes=0))
    assert place.state().stop_reason == "max-resumes"

    place.resume(limits=durably.Limits(max_resumes=5))
    assert place.service.effects() == REFERENCE
    assert place.state().resumes == 2


def test_turn_and_dollar_limits_hold_across_restarts(tmp_path: Path) -> None:
    """Turns come from the state: a run killed at its second reply resumed with
    max_turns=2 stops before a third; a lost reply's worst case counts toward max_dollars.
    """
    place = Place(tmp_path)
    place.killed_at(SavePoint.REPLY.crash_point, occurrence=2)
    with pytest.raises(durably.TurnLimit):
        place.resume(limits=durably.Limits(max_turns=2))
    assert place.log.turns(RUN_ID) == [1, 2]

    price = durably.Price(input=3.0, output=15.0)
    other = Place(tmp_path / "dollars")
    other.killed_at("loop.reply_received", price=price)
    lost = other.state().model_call
    assert lost is not None
    # Room for one more call's worst case, but not with the lost reply counted too.
    budget = durably.Limits(max_dollars=lost.worst_dollars * 1.5)
    with pytest.raises(durably.DollarLimit):
        other.resume(limits=budget, price=price)
    assert other.state().unsaved_dollars == pytest.approx(lost.worst_dollars)
    assert other.log.turns(RUN_ID) == [1]


def test_a_run_resumed_with_a_changed_tool_effect_stops(tmp_path: Path) -> None:
    """A run started with a keyed refund, resumed by an agent declaring it a plain write,
    stops with AgentChanged naming the tool before anything runs.
    """
    place = Place(tmp_path)
    place.killed_at(SavePoint.ATTEMPT.crash_point)
    asked = place.log.turns(RUN_ID)

    with pytest.raises(durably.AgentChanged, match="refund"):
        place.resume(config=Config(name="keys ignored", honour_keys=False))
    assert place.log.turns(RUN_ID) == asked
    assert place.service.effects() == {}


def test_a_run_owned_by_another_process_is_refused(tmp_path: Path) -> None:
    """While one process holds a run, another's DurableRunner.run of it is Locked, does nothing."""
    place = Place(tmp_path)
    place.killed_at(SavePoint.ATTEMPT.crash_point)
    asked = place.log.turns(RUN_ID)

    async def held() -> None:
        store = place.store()
        handle, _ = await store.open(RUN_ID)
        try:
            agent, runner = place.agent()
            await runner.resume(agent, RUN_ID)
        finally:
            await handle.close()
            await store.close()

    with pytest.raises(durably.Locked):
        asyncio.run(held())
    assert place.log.turns(RUN_ID) == asked
    assert place.service.effects() == {}


def test_a_saved_reply_the_request_no_longer_fits_is_a_clear_error(tmp_path: Path) -> None:
    """Resumed with the refund switched off by ``is_enabled``, the saved reply that calls it
    no longer fits its request: ReplayDiverged names the tool, the model is not asked again
    and nothing runs.
    """
    place = Place(tmp_path)
    place.killed_at(SavePoint.REPLY.crash_point, occurrence=2)
    asked = place.log.turns(RUN_ID)

    with pytest.raises(ReplayDiverged, match="'refund'"):
        place.resume(refund_enabled=False)
    assert place.log.turns(RUN_ID) == asked
    assert place.service.effects() == {}
    assert place.state().turns == 2


def test_the_handoff_is_saved_as_a_result_and_the_closer_answers(tmp_path: Path) -> None:
    """The handoff is a call of the fourth reply: the SDK acts on it, durably saves it as
    answered, and the closer's reply after it is the run's answer.
    """
    place = Place(tmp_path)
    place.run()
    state = place.state()
    (handoff,) = [
        m for m in state.messages if isinstance(m, ToolResult) and m.name.startswith("transfer")
    ]
    assert handoff.name == "transfer_to_closer"
    assert not handoff.is_error
    assert state.turns == 5
    assert state.answer == ANSWER
    assert state.usage.input_tokens == 100 * (1 + 2 + 3 + 4 + 5)


def test_run_sync_finishes_the_run_and_a_session_is_refused(tmp_path: Path) -> None:
    """``run_sync`` drives the run to its answer; a ``session=`` (a second history the
    replay would not match) is refused before anything is saved.
    """
    place = Place(tmp_path)
    agent, runner = place.agent()
    with pytest.raises(ValueError, match="session="):
        runner.run_sync(agent, TASK, run_id=RUN_ID, session=object())
    assert place.log.turns(RUN_ID) == []

    result = runner.run_sync(agent, TASK, run_id=RUN_ID)

    assert result.final_output == ANSWER
    assert place.service.effects() == REFERENCE


def test_models_named_by_string_are_saved_through_the_run_configs_provider(
    tmp_path: Path,
) -> None:
    """Agents whose model is a name get it from ``RunConfig(model_provider=...)``: the
    provider's models are wrapped too, so a finished run run again asks none of them.
    """
    from agents import RunConfig
    from agents.models.interface import Model, ModelProvider

    place = Place(tmp_path)
    desk, runner = place.agent()
    scripted = desk.model
    names: list[str | None] = []

    class Provider(ModelProvider):
        def get_model(self, model_name: str | None) -> Model:
            names.append(model_name)
            assert isinstance(scripted, Model)
            return scripted

    (closer,) = desk.handoffs
    named_closer = closer.clone(model="scripted-closer")
    named = desk.clone(model="scripted-desk", handoffs=[named_closer])
    config = RunConfig(model_provider=Provider())

    first = runner.run_sync(named, TASK, run_id=RUN_ID, run_config=config)
    asked = place.log.turns(RUN_ID)
    again = runner.run_sync(named, TASK, run_id=RUN_ID, run_config=config)

    assert first.final_output == again.final_output == ANSWER
    assert asked == [1, 2, 3, 4, 5]
    assert place.log.turns(RUN_ID) == asked  # the second run paid for nothing
    assert {"scripted-desk", "scripted-closer"} <= set(names)


def test_a_tool_needing_approval_without_an_approver_is_refused(tmp_path: Path) -> None:
    """As ``durably.Agent``: no silent approve-all; refused before anything runs."""
    place = Place(tmp_path)
    with pytest.raises(TypeError, match=r"'post_note' need approval.*AskLater.*PolicyApprover"):
        place.run(approval=frozenset({"post_note"}))
    assert not place.service.effects()
