"""The provider adapters against fake APIs on loopback: the whole m1 task, end to end."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _models_fakes import (
    M1,
    SECRET,
    FakeProvider,
    close,
    m1_fake,
    openai_call_id,
    provider_model,
    recorded_turns,
    serving,
)

from durably import FileStore, Outcome, PolicyApprover, Usage, idempotency_key, new_run_id
from durably.state import AssistantMessage, ToolResult
from durably.triage.agent import build_agent
from durably.triage.checks import run_checks
from durably.triage.world import World, load_task

PROVIDERS = ("anthropic", "openai")


@dataclass(frozen=True, kw_only=True)
class Finished:
    """A run of m1 through a fake provider, and what the provider saw."""

    outcome: Outcome
    world: World
    store_dir: Path
    fake: FakeProvider


def run_m1(tmp_path: Path, provider: str) -> Finished:
    """Run m1 to its end with the real SDK client talking to a fake provider."""
    world = World.create(tmp_path / "world", M1)
    store_dir = tmp_path / "runs"
    fake = m1_fake(provider)
    with serving(fake):
        model = provider_model(provider, fake.base_url, log=world.model_log)
        store = FileStore(store_dir)
        agent = build_agent(world=world, store=store, approver=PolicyApprover(), model=model)

        async def go() -> Outcome:
            try:
                return await agent.run(load_task(M1).description, run_id=new_run_id(M1))
            finally:
                await close(model)

        try:
            outcome = asyncio.run(go())
        finally:
            store.close_sync()
    return Finished(outcome=outcome, world=world, store_dir=store_dir, fake=fake)


@pytest.fixture(scope="module", params=PROVIDERS)
def finished(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Finished:
    """m1 run once per provider; the tests below read the same run."""
    provider: str = request.param
    return run_m1(tmp_path_factory.mktemp(provider), provider)


def replies(outcome: Outcome) -> list[AssistantMessage]:
    """The saved model replies, in order."""
    return [m for m in outcome.state.messages if isinstance(m, AssistantMessage)]


def sent_calls(provider: str, message: dict[str, Any]) -> list[tuple[str, str]]:
    """(call ID, tool name) of each call in an assistant message as sent to the provider."""
    if provider == "anthropic":
        return [(b["id"], b["name"]) for b in message["content"] if b["type"] == "tool_use"]
    return [(c["id"], c["function"]["name"]) for c in message.get("tool_calls", ())]


def answered_ids(provider: str, after: list[dict[str, Any]]) -> list[str]:
    """The call IDs the results following an assistant message answer, in order."""
    if provider == "anthropic":
        return [
            b["tool_use_id"]
            for b in after[0]["content"]
            if isinstance(b, dict) and b["type"] == "tool_result"
        ]
    ids = []
    for message in after:
        if message["role"] != "tool":
            break
        ids.append(message["tool_call_id"])
    return ids


def test_m1_through_the_real_sdk_passes_all_sixteen_checks(finished: Finished) -> None:
    """The real SDK client against a fake provider drives m1 to an answer and 16/16 checks."""
    assert finished.outcome.status == "done", finished.outcome.stop_reason
    checks = run_checks(
        world=finished.world, state=finished.outcome.state, store_dir=finished.store_dir
    )
    assert len(checks) == 16
    failing = [f"{c.name}: {c.reason}" for c in checks if not c.ok]
    assert not failing, "\n".join(failing)
    recorded = recorded_turns()
    assert finished.fake.turns() == list(range(1, len(recorded) + 1))
    usage = finished.outcome.state.usage
    recorded_usage = sum((t.usage for t in recorded), Usage())
    prompt = usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
    assert (prompt, usage.output_tokens) == (
        recorded_usage.input_tokens,
        recorded_usage.output_tokens,
    )


def test_every_request_carries_the_tool_schemas(finished: Finished) -> None:
    """Each request names every tool with its JSON Schema, in the provider's format."""
    tool_names = set(build_tool_names(finished))
    for seen in finished.fake.seen:
        tools = seen.body["tools"]
        if finished.fake.provider == "anthropic":
            schemas = {t["name"]: t["input_schema"] for t in tools}
        else:
            assert {t["type"] for t in tools} == {"function"}
            schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
        assert set(schemas) == tool_names
        assert all(schema["type"] == "object" for schema in schemas.values())
        assert schemas["show_report"]["required"] == ["report_id"]


def build_tool_names(finished: Finished) -> list[str]:
    """The names of the triage tools, as the loop fingerprinted them."""
    fingerprint = finished.outcome.state.fingerprint
    assert fingerprint is not None
    return [t.name for t in fingerprint.tools]


def test_results_go_back_under_the_provider_call_ids(finished: Finished) -> None:
    """Request n+1 repeats reply n's calls under the provider's IDs, then answers exactly those."""
    provider = finished.fake.provider
    recorded = recorded_turns()
    for number, seen in enumerate(finished.fake.seen[1:], start=1):
        messages = seen.body["messages"]
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        expected = [
            (c.id if provider == "anthropic" else openai_call_id(c.id), c.name)
            for c in recorded[number - 1].calls
        ]
        assert sent_calls(provider, messages[last]) == expected
        assert answered_ids(provider, messages[last + 1 :]) == [i for i, _ in expected]


def test_call_ids_and_arguments_are_saved_as_the_provider_gave_them(finished: Finished) -> None:
    """OpenAI's argument strings are kept byte for byte; Anthropic's parsed input canonically."""
    provider = finished.fake.provider
    saved = [c for r in replies(finished.outcome) for c in r.calls]
    recorded = [c for t in recorded_turns() for c in t.calls]
    assert len(saved) == len(recorded)
    for mine, theirs in zip(saved, recorded, strict=True):
        if provider == "anthropic":
            assert mine.id == theirs.id
            canonical = json.dumps(
                json.loads(theirs.arguments), sort_keys=True, separators=(",", ":")
            )
            assert mine.arguments == canonical
        else:
            assert mine.id == openai_call_id(theirs.id)
            assert mine.arguments == theirs.arguments
    assert saved[1].name == "show_report"
    expected = '{"report_id":"CR-1042"}' if provider == "anthropic" else '{"report_id": "CR-1042"}'
    assert saved[1].arguments == expected


def test_tool_results_are_sent_back_as_saved(finished: Finished) -> None:
    """The last request carries every saved tool result's content, error flag included."""
    provider = finished.fake.provider
    results = [m for m in finished.outcome.state.messages if isinstance(m, ToolResult)]
    final = finished.fake.seen[-1].body["messages"]
    if provider == "anthropic":
        sent = [
            (b["tool_use_id"], b.get("content", ""), b.get("is_error", False))
            for m in final
            if m["role"] == "user"
            for b in m["content"]
            if b["type"] == "tool_result"
        ]
        assert sent == [(r.call_id, r.content, r.is_error) for r in results]
    else:
        sent_tool = [(m["tool_call_id"], m["content"]) for m in final if m["role"] == "tool"]
        assert sent_tool == [
            (r.call_id, ("Error: " if r.is_error else "") + r.content) for r in results
        ]


def harness_keys(finished: Finished) -> set[str]:
    """The idempotency key of every call of the run."""
    state = finished.outcome.state
    keys = {
        idempotency_key(state.run_id, call.id)
        for r in replies(finished.outcome)
        for call in r.calls
    }
    assert len(keys) == sum(len(t.calls) for t in recorded_turns())
    return keys


def without_tool_results(provider: str, body: dict[str, Any]) -> dict[str, Any]:
    """A request body with the tools' result contents blanked out."""
    body = json.loads(json.dumps(body))
    for message in body["messages"]:
        if provider == "openai" and message["role"] == "tool":
            message["content"] = ""
        elif provider == "anthropic" and isinstance(message["content"], list):
            for block in message["content"]:
                if block["type"] == "tool_result":
                    block["content"] = ""
    return body


def test_no_harness_data_reaches_the_model(finished: Finished) -> None:
    """No idempotency key, run ID, API key or local path is in the model input durably builds."""
    keys = harness_keys(finished)
    for seen in finished.fake.seen:
        model_visible = json.dumps(without_tool_results(finished.fake.provider, seen.body))
        assert not [key for key in keys if key in model_visible]
        assert finished.outcome.state.run_id not in json.dumps(seen.body)
        assert SECRET not in json.dumps(seen.body)
        assert str(finished.world.root) not in json.dumps(seen.body)
        allowed = {"model", "max_tokens", "messages", "system", "tools", "stream"}
        allowed |= {"stream_options", "prompt_cache_key"}
        assert set(seen.body) <= allowed


def test_tool_results_carry_no_idempotency_key(finished: Finished) -> None:
    """No tool result the model is shown contains a call's idempotency key."""
    keys = harness_keys(finished)
    last = json.dumps(finished.fake.seen[-1].body)
    assert not [key for key in keys if key in last]
