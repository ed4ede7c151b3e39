"""Streaming: a reply reaches the observer in pieces as it arrives; only whole replies are saved."""

from __future__ import annotations

import asyncio
import io
import json
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from _models_fakes import M1, close, m1_fake, provider_model, serving
from rich.console import Console

from _helpers.patience import stretched
from durably import (
    Delta,
    FileStore,
    Limits,
    ModelRequest,
    PolicyApprover,
    Reply,
    TurnLimit,
    new_run_id,
)
from durably.loop import Event, EventKind
from durably.state import AssistantMessage, Phase, UserMessage
from durably.triage.agent import build_agent
from durably.triage.cli import _Live
from durably.triage.world import World, load_task

PROVIDERS = ("anthropic", "openai")
CHILD = Path(__file__).with_name("_models_child.py")
DELTAS = ("text-delta", "arguments-delta")


def same_arguments(provider: str, streamed: str, saved: str) -> bool:
    """OpenAI's saved arguments are the streamed bytes; Anthropic's their canonical JSON."""
    if provider == "openai":
        return streamed == saved
    return bool(json.loads(streamed) == json.loads(saved))


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_streamed_run_shows_each_reply_in_pieces_before_it_is_saved(
    tmp_path: Path, provider: str
) -> None:
    """Text then argument pieces of turn n arrive after turn n-1's results and before reply n."""
    world = World.create(tmp_path / "world", M1)
    store = FileStore(tmp_path / "runs")
    events: list[Event] = []
    fake = m1_fake(provider)
    with serving(fake):
        model = provider_model(provider, fake.base_url)
        agent = build_agent(
            world=world, store=store, approver=PolicyApprover(), model=model, observer=events.append
        )

        async def go() -> None:
            try:
                await agent.run(load_task(M1).description, run_id=new_run_id(M1))
            finally:
                await close(model)

        try:
            asyncio.run(go())
            state = store.read_sync(store.list_runs_sync()[0])
        finally:
            store.close_sync()

    print(f"\n{provider}: the first events of a streamed m1 run")
    for event in events[:14]:
        shown = {k: v for k, v in event.data.items() if k in ("turn", "call_id", "tool", "text")}
        print(f"  {event.kind:16} {json.dumps(shown)[:96]}")
    replies = [m for m in state.messages if isinstance(m, AssistantMessage)]
    assert state.phase is Phase.DONE
    assert fake.streamed == len(replies) == 11
    start = 1  # after "started"
    for reply in replies:
        end = next(
            i for i, e in enumerate(events) if e.kind == "reply" and e.data["turn"] == reply.turn
        )
        pieces = events[start:end]
        deltas = [e for e in pieces if e.kind in DELTAS]
        # Everything between the previous turn's last result and this reply is this reply's stream.
        assert [e.kind for e in pieces if e.kind not in DELTAS] == []
        assert {e.data["turn"] for e in deltas} == {reply.turn}
        texts = [e.data["text"] for e in deltas if e.kind == "text-delta"]
        assert "".join(texts) == (reply.text or "")
        assert len(texts) > 1  # in pieces, not in one go
        kinds = [e.kind for e in deltas]
        first_call = kinds.index("arguments-delta") if reply.calls else len(deltas)
        assert all(e.kind == "text-delta" for e in deltas[:first_call])
        streamed_calls = list(dict.fromkeys(e.data["call_id"] for e in deltas[first_call:]))
        assert streamed_calls == [c.id for c in reply.calls]
        for call in reply.calls:
            pieces_of_call = [e for e in deltas if e.data.get("call_id") == call.id]
            assert {e.data["tool"] for e in pieces_of_call} == {call.name}
            joined = "".join(e.data["text"] for e in pieces_of_call)
            assert same_arguments(provider, joined, call.arguments)
        # The reply's own calls and results follow; the next turn's stream starts after them.
        start = next((i for i, e in enumerate(events) if i > end and e.kind in DELTAS), len(events))
        assert all(e.kind not in DELTAS for e in events[end:start])


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_process_killed_mid_stream_asks_again_exactly_once(tmp_path: Path, provider: str) -> None:
    """SIGKILL while turn 2 streams in saves none of it; the resumed run asks for it once more."""
    world = World.create(tmp_path / "world", M1)
    store_dir = tmp_path / "runs"
    run_id = new_run_id(M1)
    fake = m1_fake(provider)
    with serving(fake):
        child = subprocess.run(
            [
                *(sys.executable, str(CHILD), provider, fake.base_url),
                *(str(world.root), str(store_dir), run_id, "mid-stream", "2"),
            ],
            capture_output=True,
            text=True,
            timeout=stretched(60),
            check=False,
        )
        assert child.returncode == -signal.SIGKILL, child.stderr
        assert fake.turns() == [1, 2]
        store = FileStore(store_dir)
        try:
            dead = store.read_sync(run_id)
            assert (dead.turns, dead.phase) == (1, Phase.MODEL)
            assert [m.turn for m in dead.messages if isinstance(m, AssistantMessage)] == [1]

            model = provider_model(provider, fake.base_url)
            agent = build_agent(
                world=World.open(world.root),
                store=store,
                approver=PolicyApprover(),
                model=model,
                limits=Limits(max_turns=3),
            )

            async def resume() -> None:
                try:
                    await agent.resume(run_id)
                finally:
                    await close(model)

            with pytest.raises(TurnLimit):
                asyncio.run(resume())
            state = store.read_sync(run_id)
        finally:
            store.close_sync()
    assert fake.turns() == [1, 2, 2, 3]
    assert fake.seen[2].body == fake.seen[1].body  # the same question, byte for byte
    assert [m.turn for m in state.messages if isinstance(m, AssistantMessage)] == [1, 2, 3]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_streamed_reply_is_the_reply_asked_for_whole(provider: str) -> None:
    """Turn 1 of m1 streamed and not streamed gives the same text, calls, arguments and usage."""
    request = ModelRequest(
        run_id="r",
        turn=1,
        system="You triage crash reports.",
        messages=(UserMessage(text="Triage batch m1."),),
        tools=(),
    )
    pieces: list[Delta] = []
    request = replace(request, on_delta=pieces.append)
    fake = m1_fake(provider, cache=False)
    with serving(fake):

        async def both() -> tuple[Reply, Reply]:
            streamed = provider_model(provider, fake.base_url)
            whole = provider_model(provider, fake.base_url, stream=False)
            try:
                return await streamed.reply(request), await whole.reply(request)
            finally:
                await close(streamed)
                await close(whole)

        streamed, whole = asyncio.run(both())
    assert [bool(s.body.get("stream")) for s in fake.seen] == [True, False]
    assert streamed == whole
    assert "".join(p.text for p in pieces if p.call_id is None) == whole.text
    assert [p.call_id for p in pieces if p.call_id] == [c.id for c in whole.calls]


def test_the_live_display_shows_streamed_text_on_its_own_line() -> None:
    """The CLI prints text pieces as they come and ends their line before the turn's summary."""
    out = io.StringIO()
    live = _Live(Console(file=out, width=100))
    events: list[tuple[EventKind, dict[str, Any]]] = [
        ("text-delta", {"turn": 1, "text": "I'll start "}),
        ("text-delta", {"turn": 1, "text": "by listing."}),
        ("arguments-delta", {"turn": 1, "call_id": "c1", "tool": "list_reports", "text": "{}"}),
        (
            "reply",
            {"turn": 1, "text": "I'll start by listing.", "calls": [("c1", "x")], "dollars": 0},
        ),
    ]
    for kind, data in events:
        live(Event(kind=kind, run_id="r", data=data))
    assert out.getvalue().splitlines() == [
        "I'll start by listing.",
        "turn 1 $0.0000 I'll start by listing.",
    ]
