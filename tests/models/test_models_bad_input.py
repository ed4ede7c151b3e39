"""Replies a tool cannot use: saved as the provider gave them, answered with an error result."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _models_fakes import M1, FakeProvider, close, provider_model, serving

from durably import FileStore, Outcome, PolicyApprover, new_run_id
from durably.state import AssistantMessage, ToolResult
from durably.triage.agent import build_agent
from durably.triage.world import World, load_task

BROKEN = '{"report_id": "CR-1042"'
"""Arguments cut off before the closing brace: not JSON."""


def run_two_turns(
    tmp_path: Path, provider: str, answer: Callable[[int], dict[str, Any]]
) -> tuple[Outcome, FakeProvider]:
    """Run m1's agent against a fake answering from ``answer`` until it is done."""
    world = World.create(tmp_path / "world", M1)
    store = FileStore(tmp_path / "runs")
    fake = FakeProvider(provider, answer)

    async def go() -> Outcome:
        model = provider_model(provider, fake.base_url)
        agent = build_agent(world=world, store=store, approver=PolicyApprover(), model=model)
        try:
            return await agent.run(load_task(M1).description, run_id=new_run_id(M1))
        finally:
            await close(model)

    try:
        with serving(fake):
            outcome = asyncio.run(go())
    finally:
        store.close_sync()
    return outcome, fake


def openai_answer(turn: int) -> dict[str, Any]:
    """Turn 1: a call with broken arguments and a call to a tool that does not exist."""
    message: dict[str, Any] = {"role": "assistant", "content": "Done." if turn > 1 else None}
    if turn == 1:
        message["tool_calls"] = [
            {
                "id": "call_broken",
                "type": "function",
                "function": {"name": "show_report", "arguments": BROKEN},
            },
            {
                "id": "call_unknown",
                "type": "function",
                "function": {"name": "delete_everything", "arguments": "{}"},
            },
        ]
    return {
        "id": f"chatcmpl-{turn}",
        "object": "chat.completion",
        "created": 0,
        "model": "gpt-4.1-2025-04-14",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if turn == 1 else "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
    }


def results(outcome: Outcome) -> dict[str, ToolResult]:
    """The run's tool results, by call ID."""
    return {m.call_id: m for m in outcome.state.messages if isinstance(m, ToolResult)}


def test_openai_invalid_json_is_saved_verbatim_and_answered_with_an_error(
    tmp_path: Path,
) -> None:
    """Broken arguments are saved byte for byte, become an error result, and go back verbatim."""
    outcome, fake = run_two_turns(tmp_path, "openai", openai_answer)

    assert outcome.status == "done"
    first = next(m for m in outcome.state.messages if isinstance(m, AssistantMessage))
    assert [(c.id, c.name, c.arguments) for c in first.calls] == [
        ("call_broken", "show_report", BROKEN),
        ("call_unknown", "delete_everything", "{}"),
    ]
    broken, unknown = results(outcome)["call_broken"], results(outcome)["call_unknown"]
    assert broken.is_error
    assert "not valid JSON" in broken.content
    assert unknown.is_error
    assert "unknown tool 'delete_everything'" in unknown.content

    second = fake.seen[1].body["messages"]
    assistant = next(m for m in second if m["role"] == "assistant")
    assert assistant["tool_calls"][0]["function"]["arguments"] == BROKEN
    tool_messages = {m["tool_call_id"]: m["content"] for m in second if m["role"] == "tool"}
    assert set(tool_messages) == {"call_broken", "call_unknown"}
    assert all(content.startswith("Error: ") for content in tool_messages.values())


def anthropic_answer(turn: int) -> dict[str, Any]:
    """Turn 1: a call to a tool that does not exist; turn 2: the answer."""
    content: list[dict[str, Any]] = (
        [{"type": "tool_use", "id": "toolu_unknown", "name": "delete_everything", "input": {}}]
        if turn == 1
        else [{"type": "text", "text": "Done."}]
    )
    return {
        "id": f"msg_{turn}",
        "type": "message",
        "role": "assistant",
        "model": "claude-haiku-4-5-20251001",
        "content": content,
        "stop_reason": "tool_use" if turn == 1 else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 100, "output_tokens": 10},
    }


def test_anthropic_unknown_tool_is_answered_with_an_error_result(tmp_path: Path) -> None:
    """A call to an unknown tool is saved, answered with is_error, and sent back as such."""
    outcome, fake = run_two_turns(tmp_path, "anthropic", anthropic_answer)

    assert outcome.status == "done"
    assert outcome.answer == "Done."
    unknown = results(outcome)["toolu_unknown"]
    assert unknown.is_error
    assert "unknown tool" in unknown.content
    second = fake.seen[1].body["messages"]
    blocks = [b for m in second if m["role"] == "user" for b in m["content"]]
    sent = next(b for b in blocks if b["type"] == "tool_result")
    assert sent["tool_use_id"] == "toolu_unknown"
    assert sent["is_error"] is True
    assert "unknown tool" in sent["content"]
