"""Values user code hands to durably are checked where they enter (SPEC section 10).

A wrong type is a clear error naming the tool (or model, or approver) and the
call; for a tool it is the call's error result, for a model adapter or an
approver it is raised before anything of it is saved. Every checkpoint written
loads again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from _loop_world import ANSWER, TASK, World, answer, reply
from typing_extensions import override

import durably
from durably import (
    Agent,
    Call,
    Done,
    Effect,
    FileStore,
    Limits,
    No,
    Phase,
    Reply,
    ScriptedApprover,
    ScriptedModel,
    ToolContext,
    Usage,
    Yes,
)
from durably.approval import ApprovalRequest
from durably.stores.journal import JournalStore

_deep: list[Any] = []
_cursor = _deep
for _ in range(10_000):
    _cursor.append([])
    _cursor = _cursor[0]


def reload(world: World, run_id: str) -> durably.RunState:
    """The run as a new process loads it, from the snapshot store and from the journal store."""
    state = world.state(run_id)
    journal = JournalStore(world.runs, sync=False)
    try:
        assert journal.read_sync(run_id) == state
    finally:
        journal.close_sync()
    return state


def refund_agent(world: World, lookup: Any, approver: durably.Approver | None = None) -> Agent:
    """The README's refund tool against a payments service whose refund IDs are ints.

    The refund times out (``ToolInDoubt``) after the service acted, so the ladder asks
    the lookup at once, as it would after a crash.
    """

    @durably.tool(effect=Effect.WRITE, lookup=lookup)
    async def refund(ctx: ToolContext, order_id: str, cents: int) -> str:
        """Refund an order."""
        raise durably.ToolInDoubt("the payments service timed out")

    return Agent(
        model=ScriptedModel(
            [reply(("c1", "refund", '{"order_id": "1042", "cents": 500}')), answer()]
        ),
        tools=[refund],
        store=world.store(),
        approver=approver or ScriptedApprover(),
        clock=world.now,
    )


def test_a_lookup_answering_found_with_an_int_is_an_error_at_the_lookup_not_a_corrupt_run(
    world: World,
) -> None:
    """The README's lookup returning ``Found(found.id)`` with an int ID fails at the lookup,
    naming Found.result; the run pauses for a person, and its checkpoint loads.
    """

    async def find_refund(ctx: ToolContext, order_id: str, cents: int) -> durably.Lookup:
        return durably.Found(1042)  # type: ignore[arg-type]  # what an int ID gives

    outcome = asyncio.run(refund_agent(world, find_refund).run("refund order 1042", name="r"))

    assert outcome.status == "paused"
    (question,) = outcome.pending
    assert question.call_id == "c1"
    assert "its lookup failed (TypeError: Found.result must be the text the model" in (
        question.why or ""
    )
    assert "expected str, got int 1042" in (question.why or "")
    assert reload(world, outcome.run_id) == outcome.state

    done = asyncio.run(
        refund_agent(world, find_refund).resume(
            outcome.run_id, decisions={"c1": Done("refund 1042 went through")}
        )
    )
    assert (done.status, done.answer) == ("done", ANSWER)


def test_a_found_changed_after_its_check_is_still_refused_by_the_ladder(world: World) -> None:
    """A Found whose result became non-text after it was built is refused at the lookup too."""

    async def find_refund(ctx: ToolContext, order_id: str, cents: int) -> durably.Lookup:
        found = durably.Found("placeholder")
        object.__setattr__(found, "result", {"id": 1042})
        return found

    outcome = asyncio.run(refund_agent(world, find_refund).run("refund order 1042", name="r"))

    assert outcome.status == "paused"
    assert "its lookup returned Found with an unusable result: expected str, got dict" in (
        outcome.pending[0].why or ""
    )
    assert reload(world, outcome.run_id) == outcome.state


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("a\ud800b", "a lone surrogate that UTF-8 (and so JSON) cannot encode"),
        ({None: 1}, "cannot be written as JSON"),
        (object(), "cannot be written as JSON"),
        (_deep, "cannot be written as JSON"),
    ],
    ids=["lone-surrogate", "none-key", "object", "deep"],
)
def test_a_tool_result_that_cannot_be_saved_is_an_error_result_naming_tool_and_call(
    world: World, value: object, complaint: str
) -> None:
    """A tool returning what the state cannot hold gives the model an error result naming
    the tool and the call; the run goes on and every checkpoint loads.
    """

    @durably.tool(effect=Effect.READ)
    async def lookup_order(ctx: ToolContext, order_id: str) -> object:
        """Find an order."""
        return value

    agent = Agent(
        model=ScriptedModel([reply(("c1", "lookup_order", '{"order_id": "7"}')), answer()]),
        tools=[lookup_order],
        store=world.store(),
        clock=world.now,
    )

    outcome = asyncio.run(agent.run(TASK, name="job"))

    assert (outcome.status, outcome.answer) == ("done", ANSWER)
    (result,) = [m for m in outcome.state.messages if isinstance(m, durably.state.ToolResult)]
    assert result.is_error
    assert "ToolResultError: tool 'lookup_order' returned a result for call 'c1'" in result.content
    assert complaint in result.content
    assert reload(world, outcome.run_id) == outcome.state


def test_values_json_can_hold_are_the_tools_result_as_json(world: World) -> None:
    """A tool returning bytes, a big int or a nested dict gets them as JSON text, not an error."""

    @durably.tool(effect=Effect.READ)
    async def facts(ctx: ToolContext) -> object:
        """Facts."""
        return {"big": 2**80, "raw": b"\x00\xff", "nested": {"a": [1, None]}}

    agent = Agent(
        model=ScriptedModel([reply(("c1", "facts", "{}")), answer()]),
        tools=[facts],
        store=world.store(),
        clock=world.now,
    )
    outcome = asyncio.run(agent.run(TASK, name="job"))
    (result,) = [m for m in outcome.state.messages if isinstance(m, durably.state.ToolResult)]
    assert (result.is_error, result.content) == (
        False,
        '{"big":1208925819614629174706176,"raw":"AP8=","nested":{"a":[1,null]}}',
    )


@pytest.mark.parametrize(
    "intends_does",
    ["raises", "returns-a-list", "returns-an-int-path", "returns-an-int-content"],
)
def test_an_intends_hook_that_fails_is_an_error_result_and_the_run_goes_on(
    world: World, intends_does: str
) -> None:
    """``intends`` raising or returning nonsense gives the call an error result (no marker, the
    tool never runs) instead of escaping ``run()`` and killing every resume.
    """
    ran: list[str] = []

    async def planned(ctx: ToolContext, path: str, text: str) -> Mapping[str, Any]:
        if intends_does == "raises":
            raise ValueError(f"the snippet occurs 0 times in {path}")
        if intends_does == "returns-a-list":
            return [path]  # type: ignore[return-value]
        if intends_does == "returns-an-int-path":
            return {7: text}  # type: ignore[dict-item]  # the nonsense under test
        return {path: 7}

    @durably.tool(effect=Effect.IDEMPOTENT, intends=planned)
    async def patch(ctx: ToolContext, path: str, text: str) -> str:
        """Patch a file."""
        ran.append(ctx.call_id)
        return "patched"

    agent = Agent(
        model=ScriptedModel([reply(("p1", "patch", '{"path": "a.py", "text": "x"}')), answer()]),
        tools=[patch],
        store=world.store(),
        clock=world.now,
    )

    outcome = asyncio.run(agent.run(TASK, name="job"))

    assert (outcome.status, ran, outcome.state.markers) == ("done", [], {})
    (result,) = [m for m in outcome.state.messages if isinstance(m, durably.state.ToolResult)]
    assert result.is_error
    if intends_does == "raises":
        assert result.content == "ValueError: the snippet occurs 0 times in a.py"
    else:
        assert "intends of tool 'patch' for call 'p1'" in result.content
    assert reload(world, outcome.run_id) == outcome.state


def test_a_tool_error_whose_message_cannot_be_stored_is_escaped(world: World) -> None:
    """An exception message holding a lone surrogate, or one that cannot even be shown,
    still becomes a storable error result.
    """

    class Unshowable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    @durably.tool(effect=Effect.READ)
    async def odd(ctx: ToolContext, n: int) -> str:
        """Fail oddly."""
        raise (ValueError("bad \udcff byte") if n == 1 else Unshowable())

    agent = Agent(
        model=ScriptedModel(
            [reply(("c1", "odd", '{"n": 1}'), ("c2", "odd", '{"n": 2}')), answer()]
        ),
        tools=[odd],
        store=world.store(),
        clock=world.now,
    )
    outcome = asyncio.run(agent.run(TASK, name="job"))
    contents = [
        m.content for m in outcome.state.messages if isinstance(m, durably.state.ToolResult)
    ]
    assert contents == [
        "ValueError: bad \\udcff byte",
        "Unshowable: <the message could not be shown: RuntimeError>",
    ]
    assert reload(world, outcome.run_id) == outcome.state


def test_a_tool_in_doubt_whose_message_cannot_be_shown_is_still_settled(world: World) -> None:
    """ToolInDoubt carrying a value whose str() fails still goes to the ladder and settles."""

    async def found(ctx: ToolContext, note: str) -> durably.Lookup:
        return durably.Found("filed #1")

    @durably.tool(effect=Effect.WRITE, lookup=found)
    async def file_note(ctx: ToolContext, note: str) -> str:
        """File a note."""
        raise durably.ToolInDoubt(_deep)

    agent = Agent(
        model=ScriptedModel([reply(("w1", "file_note", '{"note": "n"}')), answer()]),
        tools=[file_note],
        store=world.store(),
        clock=world.now,
    )
    outcome = asyncio.run(agent.run(TASK, name="job"))
    assert (outcome.status, outcome.state.resolutions["w1"].outcome) == ("done", "found")
    assert reload(world, outcome.run_id) == outcome.state


class SaysYesInWords(ScriptedApprover):
    """An approver that answers with a string instead of ``Yes()``."""

    @override
    async def approve(self, request: ApprovalRequest) -> Any:
        return "yes"


def test_an_approver_answering_the_wrong_type_is_refused_and_the_run_stays_paused(
    world: World,
) -> None:
    """An approval answer that is not Yes/No raises InvalidValue naming the approver, call and
    tool; the question stays saved, and a working approver carries the run on.
    """

    @durably.tool(effect=Effect.WRITE, needs_approval=True)
    async def file_issue(ctx: ToolContext, title: str) -> str:
        """File an issue."""
        return "filed #1"

    def agent(approver: durably.Approver) -> Agent:
        return Agent(
            model=ScriptedModel([reply(("f1", "file_issue", '{"title": "t"}')), answer()]),
            tools=[file_issue],
            store=world.store(),
            approver=approver,
            clock=world.now,
        )

    with pytest.raises(durably.InvalidValue) as refused:
        asyncio.run(agent(SaysYesInWords()).run(TASK, name="job"))

    assert str(refused.value).startswith(
        "approver.approve for call 'f1' of tool 'file_issue': expected Yes() or No(), got str 'yes'"
    )
    run_id = world.run_id()
    paused = reload(world, run_id)
    assert (paused.phase, list(paused.pending)) == (Phase.PAUSED, ["f1"])
    done = asyncio.run(agent(ScriptedApprover(approve=[Yes()])).resume(run_id))
    assert done.status == "done"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Done(1042), "Done.result must be the text the model will see"),  # type: ignore[arg-type]
        (lambda: No(None), "No.reason must be the text the model will see"),  # type: ignore[arg-type]
        (lambda: durably.Found(b"x"), "Found.result must be the text the model will see"),  # type: ignore[arg-type]
        (lambda: Done("\ud800"), "a lone surrogate"),
    ],
    ids=["done-int", "no-none", "found-bytes", "done-surrogate"],
)
def test_answers_refuse_text_the_state_cannot_hold_when_they_are_built(
    make: Any, message: str
) -> None:
    """Done, No and Found check their text when built, so the error points at the user's line."""
    with pytest.raises(TypeError, match=message):
        make()


def test_a_decision_whose_text_was_changed_is_refused_before_it_is_saved(world: World) -> None:
    """A ``resume(decisions=)`` answer carrying non-text is InvalidValue, and nothing is saved."""

    async def unknown(ctx: ToolContext, order_id: str, cents: int) -> durably.Lookup:
        return durably.UNKNOWN

    paused = asyncio.run(refund_agent(world, unknown).run("refund order 1042", name="r"))
    before = reload(world, paused.run_id)
    bad = Done("placeholder")
    object.__setattr__(bad, "result", 1042)

    with pytest.raises(durably.InvalidValue, match="the decision for call 'c1'"):
        asyncio.run(refund_agent(world, unknown).resume(paused.run_id, decisions={"c1": bad}))
    assert reload(world, paused.run_id) == before


class OddModel(ScriptedModel):
    """A model adapter whose first reply is whatever the test gives it."""

    def __init__(self, first: Any, **kwargs: Any) -> None:
        super().__init__([answer(), answer()], **kwargs)
        self.first = first

    @override
    async def reply(self, request: durably.ModelRequest) -> Any:
        await super().reply(request)
        return self.first if request.turn == 1 else answer()


@pytest.mark.parametrize(
    ("first", "complaint"),
    [
        ({"text": "hi"}, "model.reply returned: expected durably.Reply, got dict"),
        (Reply(text=42), "text: expected str, got int 42"),  # type: ignore[arg-type]
        (Reply(calls=[Call(7, "x")]), "calls[0].id: expected str, got int 7"),  # type: ignore[arg-type]
        (Reply(calls=[Call("c", "x", "{\udc80}")]), "calls[0].arguments: the text holds"),
        (Reply(text="hi", usage=Usage(input_tokens=-1)), "usage: input_tokens must be"),
        (Reply(text="hi", usage=Usage(output_tokens="9")), "usage: output_tokens must be"),  # type: ignore[arg-type]
        (Reply(text="hi", model=3), "model: expected str"),  # type: ignore[arg-type]
    ],
    ids=[
        "not-a-reply",
        "int-text",
        "int-call-id",
        "surrogate-args",
        "negative",
        "str-tokens",
        "model",
    ],
)
def test_a_model_reply_that_cannot_be_saved_is_a_model_error_before_anything_of_it_is_saved(
    world: World, first: Any, complaint: str
) -> None:
    """A reply of the wrong shape is ModelError naming the model and the turn; the reply is not
    saved, and a resume asks again and counts the lost call at its worst case.
    """
    agent = Agent(
        model=OddModel(first, name="adapter"), tools=[], store=world.store(), clock=world.now
    )

    with pytest.raises(durably.ModelError) as refused:
        asyncio.run(agent.run(TASK, name="job"))

    assert str(refused.value).startswith(f"adapter: the reply for turn 1 is unusable: {complaint}")
    saved = reload(world, world.run_id())
    assert (saved.turns, len(saved.messages), saved.model_call is not None) == (0, 1, True)
    healthy = Agent(
        model=ScriptedModel([answer()], name="adapter"),
        tools=[],
        store=world.store(),
        clock=world.now,
    )
    done = asyncio.run(healthy.resume(saved.run_id))
    assert (done.answer, done.state.unsaved_replies, done.state.model_call) == (ANSWER, 1, None)


class PricedBadly(ScriptedModel):
    """A scripted model whose price is not a number."""

    @override
    def dollars(self, usage: Usage) -> float:
        return float("nan")


def test_a_model_whose_price_is_not_an_amount_is_a_model_error(world: World) -> None:
    """``model.dollars`` returning NaN is ModelError before any call (a NaN budget is no budget)."""
    agent = Agent(
        model=PricedBadly([answer()], name="adapter"),
        tools=[],
        store=world.store(),
        limits=Limits(max_dollars=1.0),
        clock=world.now,
    )
    with pytest.raises(durably.ModelError, match=r"model\.dollars returned float nan"):
        asyncio.run(agent.run(TASK, name="job"))
    assert world.model_turns() == []


def test_an_empty_run_id_is_refused_not_replaced_by_a_new_one(tmp_path: Path) -> None:
    """``Agent.run(run_id="")`` raises InvalidRunId at once and creates no run."""
    store = FileStore(tmp_path / "runs", sync=False)
    agent = Agent(model=ScriptedModel([answer()]), tools=[], store=store)
    try:
        with pytest.raises(durably.InvalidRunId, match="invalid run ID ''"):
            asyncio.run(agent.run(TASK, run_id=""))
        assert store.list_runs_sync() == []
    finally:
        store.close_sync()


def test_a_task_the_state_cannot_hold_is_refused_before_a_run_exists(tmp_path: Path) -> None:
    """A task with a lone surrogate is InvalidValue naming Agent.run, and no run is created."""
    store = FileStore(tmp_path / "runs", sync=False)
    agent = Agent(model=ScriptedModel([answer()]), tools=[], store=store)
    try:
        with pytest.raises(durably.InvalidValue, match=r"Agent.run\(task\)"):
            asyncio.run(agent.run("refund \udc80"))
        assert store.list_runs_sync() == []
    finally:
        store.close_sync()


def test_an_observer_that_raises_does_not_stop_the_run(world: World) -> None:
    """The observer only watches: one that raises on every event leaves the run to finish."""

    def broken(event: durably.Event) -> None:
        raise RuntimeError("the display broke")

    agent = Agent(
        model=ScriptedModel([reply(("r1", "read", '{"item": "x"}')), answer()]),
        tools=[],
        store=world.store(),
        clock=world.now,
        observer=broken,
    )
    outcome = asyncio.run(agent.run(TASK, name="job"))
    assert (outcome.status, outcome.answer) == ("done", ANSWER)


def test_a_summary_that_fails_keeps_the_history_and_the_run_goes_on(world: World) -> None:
    """A context policy whose summarize raises keeps history whole instead of losing the result."""

    def summarize(previous: str | None, dropped: object) -> str:
        raise RuntimeError("summarizer down")

    agent = Agent(
        model=ScriptedModel([reply((f"r{n}", "nope", "{}")) for n in range(1, 4)] + [answer()]),
        tools=[],
        store=world.store(),
        clock=world.now,
        context_policy=durably.ContextPolicy(max_messages=3, keep=1, summarize=summarize),
    )
    outcome = asyncio.run(agent.run(TASK, name="job"))
    assert (outcome.status, outcome.state.summary, len(outcome.state.messages)) == (
        "done",
        None,
        8,
    )
