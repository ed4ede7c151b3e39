"""Recording a provider run into a replay file, and playing it back as a test."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from _models_fakes import (
    M1,
    SECRET,
    FakeProvider,
    close,
    provider_model,
    recorded_answer,
    recorded_turns,
    serving,
)

from durably import (
    Call,
    FileStore,
    Limits,
    Model,
    ModelError,
    ModelRequest,
    PolicyApprover,
    Reply,
    ScriptedModel,
    TurnLimit,
    Usage,
    new_run_id,
)
from durably.models.recorder import RecordingModel
from durably.models.replay import ReplayModel, load_recording
from durably.state import AssistantMessage, RunState, ToolCall, ToolResult, UserMessage
from durably.triage.agent import build_agent
from durably.triage.world import World, load_task

TURNS = 4


def run_m1(root: Path, model: Model) -> RunState:
    """Run m1's agent with ``model`` for ``TURNS`` turns; the saved state."""
    world = World.create(root / "world", M1)
    store = FileStore(root / "runs")
    run_id = new_run_id(M1)
    agent = build_agent(
        world=world,
        store=store,
        approver=PolicyApprover(),
        model=model,
        limits=Limits(max_turns=TURNS),
    )

    async def go() -> None:
        try:
            await agent.run(load_task(M1).description, run_id=run_id)
        finally:
            await close(model)

    try:
        with pytest.raises(TurnLimit):
            asyncio.run(go())
        return store.read_sync(run_id)
    finally:
        store.close_sync()


def replies(state: RunState) -> list[tuple[str | None, tuple[ToolCall, ...], Usage, float]]:
    """What each saved reply said, called, used and cost."""
    return [
        (m.text, m.calls, m.usage, m.dollars)
        for m in state.messages
        if isinstance(m, AssistantMessage)
    ]


def test_a_recorded_provider_run_replays_the_same_and_holds_no_secret(tmp_path: Path) -> None:
    """A run through the real SDK, recorded, replays to the same saved replies; no key is kept."""
    path = tmp_path / "recording.json"
    fake = FakeProvider("anthropic", recorded_answer("anthropic", recorded_turns()))
    with serving(fake):
        live = RecordingModel(provider_model("anthropic", fake.base_url), path)
        recorded_state = run_m1(tmp_path / "live", live)

    data = path.read_bytes()
    for secret in (SECRET, "x-api-key", "authorization", "127.0.0.1", fake.base_url):
        assert secret.encode() not in data
    recording = load_recording(path)
    assert recording.model == "claude-haiku-4-5"
    assert (recording.price.input, recording.price.output) == (1.0, 5.0)
    assert recording.task == load_task(M1).description
    assert len(recording.turns) == TURNS

    replayed_state = run_m1(tmp_path / "replay", ReplayModel(path))
    assert replies(replayed_state) == replies(recorded_state)
    assert replayed_state.dollars == pytest.approx(recorded_state.dollars)


def request(turn: int, history: list[AssistantMessage | ToolResult]) -> ModelRequest:
    """A request for ``turn`` after the task and ``history``."""
    return ModelRequest(
        run_id="r",
        turn=turn,
        system="",
        messages=(UserMessage(text="the task"), *history),
        tools=(),
    )


def saved(reply: Reply, turn: int) -> list[AssistantMessage | ToolResult]:
    """``reply`` as the loop saves it, with a result for each call."""
    calls = tuple(ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in reply.calls)
    return [
        AssistantMessage(text=reply.text, calls=calls, usage=reply.usage, turn=turn),
        *(ToolResult(call_id=c.id, name=c.name, content="ok") for c in calls),
    ]


def test_a_turn_asked_again_replaces_the_lost_answer(tmp_path: Path) -> None:
    """After a crash before save point 2, the new answer for that turn is what is recorded."""
    path = tmp_path / "recording.json"
    script = [
        Reply(text="one", calls=[Call("c1", "look")]),
        Reply(text="two", calls=[Call("c2", "look")]),
        Reply(text="three"),
    ]
    model = RecordingModel(ScriptedModel(script, name="scripted", fickle=True), path)

    async def go() -> None:
        first = await model.reply(request(1, []))
        history = saved(first, 1)
        await model.reply(request(2, history))  # the answer a crash loses
        again = await model.reply(request(2, history))
        await model.reply(request(3, history + saved(again, 2)))

    asyncio.run(go())
    recording = load_recording(path)
    assert [t.text for t in recording.turns] == ["one", "two", "three"]
    assert [c.id for c in recording.turns[1].calls] == ["c2-again1"]
    assert recording.task == "the task"
    assert recording.model == "scripted"
    assert (recording.price.input, recording.price.output) == (3.0, 15.0)


def test_a_file_of_another_model_is_not_overwritten(tmp_path: Path) -> None:
    """Recording into a file that holds another model's run is refused up front."""
    path = tmp_path / "recording.json"
    asyncio.run(
        RecordingModel(ScriptedModel([Reply(text="x")], name="first"), path).reply(request(1, []))
    )
    with pytest.raises(ModelError, match="holds a recording of model 'first'"):
        RecordingModel(ScriptedModel([Reply(text="y")], name="second"), path)
    assert load_recording(path).model == "first"
