"""durably.pydantic_ai: a Pydantic AI run with ``Durable`` keeps durably's promise.

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

import pytest
from _pai_world import build

import durably
from _helpers.patience import stretched
from _helpers.refund_world import ANSWER, NOTE, TASK, Service
from durably import faults
from durably.engine import Save, SavePoint
from durably.pydantic_ai import Durable, RunPaused, tool_context
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

    def agent(self, **options: object) -> tuple[object, Durable]:
        """The agent, built anew as a restarted process builds it."""
        return build(self.store(), self.service, self.log, **options)  # type: ignore[arg-type]

    def run(self, **options: object) -> object:
        """``agent.run`` of the task under the run ID, in this process."""
        agent, _ = self.agent(**options)
        return asyncio.run(agent.run(TASK, run_id=RUN_ID))  # type: ignore[attr-defined]

    def resume(self, **options: object) -> object:
        """``Durable.resume`` of the run, in this process."""
        agent, durable = self.agent(**options)
        return asyncio.run(durable.resume(agent, RUN_ID))

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

    assert first.output == again.output == ANSWER  # type: ignore[attr-defined]
    assert asked == [1, 2, 3, 4]
    assert place.log.turns(RUN_ID) == asked
    assert place.service.effects() == REFERENCE
    assert place.state().phase is durably.Phase.DONE


@pytest.mark.parametrize("store", sorted(STORES))
@pytest.mark.parametrize(
    "point",
    [
        SavePoint.START.crash_point,
        Save.MODEL_CALL.crash_point,
        "loop.reply_received",
        SavePoint.REPLY.crash_point,
        SavePoint.ATTEMPT.crash_point,
        "loop.tool_returned:refund",
        "loop.tool_returned:post_note",
        SavePoint.RESULT.crash_point,
    ],
)
def test_a_run_killed_at_a_save_point_finishes_with_every_effect_once(
    tmp_path: Path, store: str, point: str
) -> None:
    """Killed by SIGKILL at a save point (the first of each; the sweep kills at every one),
    the run resumed does each effect once and asks the model again only for a reply it had
    not saved.
    """
    place = Place(tmp_path, store=store)
    place.killed_at(point)
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
    """A tool with no effect in its metadata, and no default, stops the run before any call."""
    from pydantic_ai import Agent

    place = Place(tmp_path)
    agent, durable = place.agent()
    bare: Agent[None, str] = Agent(agent.model, capabilities=[durable])  # type: ignore[attr-defined]

    @bare.tool_plain
    async def unsure(order: str) -> str:
        """Do something to an order."""
        return order

    with pytest.raises(ValueError, match="tool 'unsure' declares no effect"):
        asyncio.run(bare.run(TASK, run_id=RUN_ID))
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
    """A note the service took without answering pauses the run with the question saved;
    ``durably pending`` lists it, ``durably answer ... done`` settles it, and the resumed
    run finishes without posting the note again or asking the model for a saved reply.
    """
    place = Place(tmp_path, doubt=frozenset({"notes"}))
    with pytest.raises(RunPaused) as paused:
        place.run()
    (call_id,) = paused.value.call_ids
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

    assert place.log.turns(RUN_ID) == [*asked, 4]
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
    with pytest.raises(RunPaused) as paused:
        place.run(approver=Away(), approval=frozenset({"post_note"}))
    (call_id,) = paused.value.call_ids
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
    """While one process holds a run, another's agent.run of it is Locked and does nothing."""
    place = Place(tmp_path)
    place.killed_at(SavePoint.ATTEMPT.crash_point)
    asked = place.log.turns(RUN_ID)

    async def held() -> None:
        store = place.store()
        handle, _ = await store.open(RUN_ID)
        try:
            agent, durable = place.agent()
            await durable.resume(agent, RUN_ID)
        finally:
            await handle.close()
            await store.close()

    with pytest.raises(durably.Locked):
        asyncio.run(held())
    assert place.log.turns(RUN_ID) == asked
    assert place.service.effects() == {}


def test_a_tool_needing_approval_without_an_approver_is_refused(tmp_path: Path) -> None:
    """As ``durably.Agent``: no silent approve-all; the error names who could answer."""
    place = Place(tmp_path)
    with pytest.raises(TypeError, match=r"'post_note' need approval.*AskLater.*PolicyApprover"):
        place.run(approval=frozenset({"post_note"}))
    assert not place.service.effects()


def test_a_requests_worst_case_bounds_its_whole_history_measured_once(tmp_path: Path) -> None:
    """The history's size in a request's worst case is never under the whole history's
    JSON, though each message is serialized once per run, not once per request.
    """
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    place = Place(tmp_path)
    messages = place.run().all_messages()  # type: ignore[attr-defined]
    _, durable = place.agent()
    bound = asyncio.run(durable.for_run(None))  # type: ignore[arg-type]
    dumped: list[object] = []
    real = ModelMessagesTypeAdapter.dump_json

    for end in range(1, len(messages) + 1):
        history = messages[:end]
        size = bound._history_size(history)  # noqa: SLF001 - the bound it computes
        assert size >= len(real(history))
        assert size <= len(real(history)) + 2 * end  # each message's own brackets, no more

    def counted(history: object) -> bytes:
        dumped.append(history)
        return real(history)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ModelMessagesTypeAdapter, "dump_json", counted)
        assert bound._history_size(messages) > 0  # noqa: SLF001
    assert dumped == []  # every message was measured already


def test_key_in_meta_sends_the_served_calls_key_in_the_mcp_requests_meta() -> None:
    """``MCPToolset(process_tool_call=key_in_meta)``: the call goes on with the model's
    arguments unchanged and the derived key in ``_meta``; outside a served call it refuses.
    """
    from durably.frontend import serving
    from durably.pydantic_ai import key_in_meta
    from durably.state import utcnow
    from durably.transports import META_KEY

    sent: list[tuple[str, dict[str, object], dict[str, object] | None]] = []

    async def call_tool(
        name: str, arguments: dict[str, object], *, metadata: dict[str, object] | None = None
    ) -> str:
        sent.append((name, dict(arguments), metadata))
        return "refunded"

    served = durably.ToolContext(
        run_id=RUN_ID,
        call_id="c2",
        idempotency_key=durably.idempotency_key(RUN_ID, "c2"),
        workspace=None,
        clock=utcnow,
    )
    with serving(served):
        got = asyncio.run(key_in_meta(None, call_tool, "refund", {"order": "1042"}))  # type: ignore[arg-type]

    assert got == "refunded"
    assert sent == [
        ("refund", {"order": "1042"}, {META_KEY: durably.idempotency_key(RUN_ID, "c2")})
    ]
    with pytest.raises(RuntimeError, match="outside a tool call"):
        asyncio.run(key_in_meta(None, call_tool, "refund", {"order": "1042"}))  # type: ignore[arg-type]
