"""Bad input (SPEC section 10): a clear error naming the thing, and nothing saved is lost."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
from _loop_world import (
    ANSWER,
    PERSON_SAYS,
    TASK,
    Job,
    Toolset,
    World,
    answer,
    reply,
    resume,
    start,
    tool_results,
)
from typing_extensions import override

import durably
from durably import Agent, Effect, Phase, ScriptedModel, ToolContext
from durably.approval import ApprovalRequest, ResolveRequest
from durably.faults import CrashPlan
from durably.state import AssistantMessage

ONE_WRITE = (reply(("w1", "write", '{"note": "refund A1"}')), answer())


class Unreachable(durably.ScriptedApprover):
    """An approver whose person cannot be reached (no terminal, a closed channel)."""

    @override
    async def approve(self, request: ApprovalRequest) -> durably.Yes | durably.No:
        raise durably.ApprovalUnavailable(
            run_id=request.run_id, call_id=request.call_id, reason="no terminal"
        )

    @override
    async def resolve(self, request: ResolveRequest) -> durably.Rerun | durably.Done:
        raise durably.ApprovalUnavailable(
            run_id=request.run_id, call_id=request.call_id, reason="no terminal"
        )


@durably.tool(effect=Effect.READ)
async def inventory(ctx: ToolContext, item: str) -> str:
    """How many of an item are in stock."""
    raise ValueError(f"no such item: {item}")


@pytest.mark.parametrize(
    ("arguments", "complaint"),
    [
        ('{"order": "A1", "cents": ', "arguments are not valid JSON"),
        ('{"order": "A1", "cents": "five"}', "arguments do not match the schema of keyed"),
        ('{"order": "A1"}', "arguments do not match the schema of keyed"),
        ('{"order": "A1", "cents": 5, "key": "k"}', "arguments do not match the schema of keyed"),
    ],
    ids=["invalid-json", "wrong-type", "missing-field", "unknown-field"],
)
def test_arguments_a_tool_cannot_take_become_an_error_result_and_it_never_runs(
    world: World, arguments: str, complaint: str
) -> None:
    """Arguments that are not JSON or break the schema are an error result; the tool never runs."""
    job = Job(replies=(reply(("b1", "keyed", arguments)), answer()))

    outcome = asyncio.run(job.agent(world).run(TASK, name="job"))

    assert outcome.answer == ANSWER
    ((call_id, content, is_error),) = tool_results(world.state())
    assert (call_id, is_error) == ("b1", True)
    assert content.startswith(complaint)
    assert world.receiver().entries() == []
    reply_saved = world.state().messages[1]
    assert isinstance(reply_saved, AssistantMessage)
    assert reply_saved.calls[0].arguments == arguments  # kept raw, as the model wrote


def test_an_unknown_tool_gets_an_error_result_listing_the_available_tools(world: World) -> None:
    """A call to a tool the agent does not have is answered with the list of tools it does have."""
    job = Job(replies=(reply(("u1", "refund_all", "{}")), answer()))

    asyncio.run(job.agent(world).run(TASK, name="job"))

    assert tool_results(world.state()) == [
        (
            "u1",
            "unknown tool 'refund_all'; available tools: idempotent, keyed, read, write",
            True,
        )
    ]


def test_a_tool_that_raises_gives_a_saved_error_result_naming_the_exception(world: World) -> None:
    """A tool's exception is saved as the call's error result, with its type and message."""
    model = ScriptedModel((reply(("i1", "inventory", '{"item": "gizmo"}')), answer()))
    agent = Agent(model=model, tools=[inventory], store=world.store(), clock=world.now)

    outcome = asyncio.run(agent.run(TASK, name="job"))

    assert outcome.answer == ANSWER
    assert tool_results(world.state()) == [("i1", "ValueError: no such item: gizmo", True)]


def test_a_lookup_that_raises_passes_the_in_doubt_call_to_a_person(world: World) -> None:
    """A failing lookup never decides: the person is asked (step 3), told why, and decides."""
    job = Job(replies=ONE_WRITE, toolset=Toolset(write_lookup="raises"), resolve=(durably.Rerun(),))
    assert start(world, job, plan=CrashPlan(label="loop.saved.attempt")).killed

    resumed = resume(world, job)

    assert resumed.finished()["answer"] == ANSWER
    decided = world.state().resolutions["w1"]
    assert (decided.step, decided.outcome) == (3, "rerun")
    assert "lookup failed (ConnectionError: the search index is down)" in (decided.detail or "")
    assert world.questions("resolve") == ["w1"]
    assert len(world.receiver().effects("write")) == 1


def test_an_unreachable_approver_leaves_the_run_paused_until_one_answers(world: World) -> None:
    """ApprovalUnavailable gives a paused outcome with its question; a later resume finishes it."""
    job = Job(replies=ONE_WRITE, toolset=Toolset(write_needs_approval=True))
    events: list[durably.Event] = []
    agent = job.agent(world, approver=Unreachable())
    agent.observer = events.append

    outcome = asyncio.run(agent.run(TASK, name="job"))

    assert (outcome.status, [p.call_id for p in outcome.pending]) == ("paused", ["w1"])
    assert [e.data["reason"] for e in events if e.kind == "unavailable"] == ["no terminal"]

    paused = world.state()
    assert (paused.phase, list(paused.pending), paused.pending["w1"].kind) == (
        Phase.PAUSED,
        ["w1"],
        "approve",
    )
    assert (paused.markers, world.receiver().entries()) == ({}, [])
    done = asyncio.run(job.agent(world).resume(paused.run_id))
    assert (done.status, done.answer) == ("done", ANSWER)
    assert len(world.receiver().effects("write")) == 1


def test_an_unreachable_person_for_an_in_doubt_call_leaves_the_run_paused(world: World) -> None:
    """ApprovalUnavailable at the ladder's step 3 leaves the run paused with the question."""
    job = Job(
        replies=ONE_WRITE,
        toolset=Toolset(write_lookup="none"),
        resolve=(durably.Done(PERSON_SAYS),),
    )
    assert start(world, job, plan=CrashPlan(label="loop.tool_returned:write")).killed

    outcome = asyncio.run(job.agent(world, approver=Unreachable()).resume(world.run_id()))
    assert (outcome.status, [p.why for p in outcome.pending]) == (
        "paused",
        ["it writes without a key and has no lookup"],
    )

    paused = world.state()
    assert (paused.phase, list(paused.pending), paused.pending["w1"].kind) == (
        Phase.PAUSED,
        ["w1"],
        "resolve",
    )
    assert list(paused.markers) == ["w1"]  # still in doubt: nothing was decided
    done = asyncio.run(job.agent(world).resume(paused.run_id))
    assert tool_results(done.state) == [("w1", PERSON_SAYS, False)]
    assert (done.state.pending, len(world.receiver().effects("write"))) == ({}, 1)


@pytest.mark.parametrize(
    ("changed", "difference"),
    [
        (
            {"toolset": Toolset(write_effect=Effect.IDEMPOTENT)},
            "tool 'write' effect write -> idempotent",
        ),
        ({"system": "You refund everything."}, "system prompt changed"),
    ],
    ids=["tool-effect", "system-prompt"],
)
def test_resuming_with_a_changed_agent_stops_with_agent_changed(
    world: World, changed: dict[str, object], difference: str
) -> None:
    """A resume by an agent unlike the run's own raises AgentChanged naming the change."""
    job = Job(replies=ONE_WRITE)
    assert start(world, job, plan=CrashPlan(label="loop.saved.reply")).killed
    other = replace(job, **changed)  # type: ignore[arg-type]

    with pytest.raises(durably.AgentChanged) as stopped:
        asyncio.run(other.agent(world).resume(world.run_id()))

    assert stopped.value.differences == [difference]
    assert difference in str(stopped.value)
    assert world.receiver().entries() == []
    allowed = asyncio.run(
        replace(other, allow_agent_change=True).agent(world).resume(world.run_id())
    )
    assert allowed.answer == ANSWER


def test_a_workspace_file_changed_behind_the_runs_back_stops_the_resume(world: World) -> None:
    """A recorded file changed before the resume stops it with WorkspaceChanged naming the file."""
    job = Job(
        replies=(
            reply(("n1", "idempotent", '{"path": "notes/a1.txt", "text": "A1 refunded"}')),
            reply(("r1", "read", '{"item": "widgets"}')),
            answer(),
        )
    )
    assert start(world, job, plan=CrashPlan(label="loop.reply_received", occurrence=2)).killed
    note = world.workspace_dir / "notes" / "a1.txt"
    note.write_text("A1 never refunded")

    with pytest.raises(durably.WorkspaceChanged) as stopped:
        asyncio.run(job.agent(world).resume(world.run_id()))

    assert stopped.value.paths == ["notes/a1.txt"]
    assert "notes/a1.txt" in str(stopped.value)
    note.write_text("A1 refunded")  # restored, as the error advises
    assert asyncio.run(job.agent(world).resume(world.run_id())).answer == ANSWER


def test_an_in_doubt_write_may_have_left_its_intended_file_behind(world: World) -> None:
    """A recorded file now holding what an in-doubt call meant to write is accepted on resume."""
    job = Job(
        replies=(
            reply(("n1", "idempotent", '{"path": "notes/a1.txt", "text": "draft"}')),
            reply(("n2", "idempotent", '{"path": "notes/a1.txt", "text": "final"}')),
            answer(),
        )
    )
    assert start(
        world, job, plan=CrashPlan(label="loop.tool_returned:idempotent", occurrence=2)
    ).killed
    assert world.workspace().read_text("notes/a1.txt") == "final"  # acted, result not saved

    done = asyncio.run(job.agent(world).resume(world.run_id()))

    assert done.answer == ANSWER
    assert done.state.resolutions["n2"].step == 1
    assert done.state.workspace == {"notes/a1.txt": durably.workspace.sha256_bytes("final")}


def test_a_tool_in_doubt_is_settled_by_the_ladder_not_handed_to_the_model(tmp_path: Path) -> None:
    """A keyed tool that raises ToolInDoubt is rerun with the same key at once, not reported."""
    keys: list[str] = []

    @durably.tool(effect=durably.Effect.KEYED, key_ttl=durably.NEVER_EXPIRES)
    async def pay(ctx: durably.ToolContext, cents: int) -> str:
        keys.append(ctx.idempotency_key)
        if len(keys) == 1:
            raise durably.ToolInDoubt("sent, no answer")
        return "paid"

    model = durably.ScriptedModel(
        [
            durably.Reply(calls=[durably.Call("p1", "pay", '{"cents": 5}')]),
            durably.Reply(text="done"),
        ]
    )
    agent = durably.Agent(model=model, tools=[pay], store=durably.FileStore(tmp_path / "s"))
    outcome = asyncio.run(agent.run("pay"))
    assert outcome.status == "done"
    (result,) = [m for m in outcome.state.messages if isinstance(m, durably.state.ToolResult)]
    assert (result.content, result.is_error) == ("paid", False)
    assert len(keys) == 2
    assert keys[0] == keys[1] == durably.idempotency_key(outcome.run_id, "p1")
    assert outcome.state.resolutions["p1"].step == 1
