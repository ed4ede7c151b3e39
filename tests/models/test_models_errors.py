"""Provider failures: transient ones are retried inside the call, the rest are ModelErrors."""

from __future__ import annotations

import asyncio
import email.utils
import logging
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import stamina
from _models_fakes import (
    M1,
    SECRET,
    STREAM_CUT,
    STREAM_ERROR,
    Answer,
    FakeProvider,
    close,
    error_body,
    provider_model,
    recorded_answer,
    recorded_turns,
    serving,
)

from durably import (
    FileStore,
    Limits,
    Model,
    ModelError,
    ModelRequest,
    PolicyApprover,
    Reply,
    TurnLimit,
    new_run_id,
)
from durably.loop import ContextPolicy
from durably.models._provider import _retry_after
from durably.models.anthropic import Retry
from durably.state import AssistantMessage, Phase, UserMessage
from durably.triage.agent import build_agent
from durably.triage.world import World, load_task

PROVIDERS = ("anthropic", "openai")
KEY_ENV = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}
OVERLOADED = {"anthropic": 529, "openai": 503}

REQUEST = ModelRequest(
    run_id="r-1",
    turn=1,
    system="You triage crash reports.",
    messages=(UserMessage(text="Triage batch m1."),),
    tools=(),
)


class Sleeps:
    """The waits the retry policy chose, read from its log (stamina's testing mode skips them)."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level(logging.INFO, logger="durably.models")
        self.caplog = caplog

    @property
    def waits(self) -> list[float]:
        """Each chosen wait, in order."""
        waits: list[float] = []
        for record in self.caplog.records:
            if record.name == "durably.models":
                assert isinstance(record.args, tuple)
                wait = record.args[-1]
                assert isinstance(wait, float)
                waits.append(wait)
        return waits


@pytest.fixture(autouse=True)
def _no_waiting() -> Iterator[None]:
    """Retries happen at once: stamina's testing mode, with the policy's own attempt count."""
    with stamina.set_testing(True, attempts=100, cap=True):
        yield


def no_jitter(low: float, high: float) -> float:
    """Always the longest wait, so the waits are predictable."""
    return high


def ask(model: Model, request: ModelRequest = REQUEST) -> Reply:
    """One model call in a fresh event loop, closing the client after."""

    async def go() -> Reply:
        try:
            return await model.reply(request)
        finally:
            await close(model)

    return asyncio.run(go())


def failing(provider: str, status: int, times: int, **headers: str) -> list[Answer]:
    """``times`` error responses with ``status``."""
    return [(status, error_body(provider, status, f"status {status}"), headers)] * times


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_rate_limit_is_retried_after_a_backoff(
    provider: str, caplog: pytest.LogCaptureFixture
) -> None:
    """429 then 200 gives one reply from two requests, with one wait in between."""
    sleeps = Sleeps(caplog)
    fake = FakeProvider(provider, recorded_answer(provider, recorded_turns()))
    fake.errors[1] = failing(provider, 429, 1, **{"retry-after": "0"})
    with serving(fake):
        model = provider_model(provider, fake.base_url, retry=Retry(jitter=no_jitter))
        reply = ask(model)
    assert [call.name for call in reply.calls] == ["list_reports"]
    assert len(fake.seen) == 2
    assert sleeps.waits == [1.0]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_overload_backs_off_exponentially_then_gives_up(
    provider: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An overload that outlasts the attempts waits 1 s, 2 s, then raises ModelError."""
    sleeps = Sleeps(caplog)
    fake = FakeProvider(provider, recorded_answer(provider, recorded_turns()))
    fake.errors[1] = failing(provider, OVERLOADED[provider], 3)
    with serving(fake):
        retry = Retry(attempts=3, jitter=no_jitter)
        model = provider_model(provider, fake.base_url, retry=retry)
        with pytest.raises(ModelError, match="after 3 attempts") as raised:
            ask(model)
    assert len(fake.seen) == 3
    assert sleeps.waits == [1.0, 2.0]
    assert raised.value.provider == provider
    assert "resume" in str(raised.value)


def test_the_provider_retry_after_is_honoured_up_to_the_cap() -> None:
    """A longer retry-after replaces the backoff, and the cap bounds it."""
    retry = Retry(base=1.0, cap=30.0, jitter=no_jitter)
    assert retry.delay(1) == 1.0
    assert retry.delay(3) == 4.0
    assert retry.delay(1, retry_after=7.0) == 7.0
    assert retry.delay(1, retry_after=600.0) == 30.0
    assert retry.delay(10) == 30.0


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_refused_key_is_a_model_error_at_once(
    provider: str, caplog: pytest.LogCaptureFixture
) -> None:
    """401 is not retried: ModelError names the API key's variable, never the key."""
    sleeps = Sleeps(caplog)
    fake = FakeProvider(provider, recorded_answer(provider, recorded_turns()))
    fake.errors[1] = failing(provider, 401, 1)
    with serving(fake):
        model = provider_model(provider, fake.base_url, retry=Retry())
        with pytest.raises(ModelError) as raised:
            ask(model)
    message = str(raised.value)
    assert len(fake.seen) == 1
    assert sleeps.waits == []
    assert "API key" in message
    assert KEY_ENV[provider] in message
    assert SECRET not in message


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_bad_request_is_not_retried(provider: str, caplog: pytest.LogCaptureFixture) -> None:
    """400 is a ModelError after one request, saying the provider refused the request."""
    sleeps = Sleeps(caplog)
    fake = FakeProvider(provider, recorded_answer(provider, recorded_turns()))
    fake.errors[1] = failing(provider, 400, 1)
    with serving(fake):
        model = provider_model(provider, fake.base_url, retry=Retry())
        with pytest.raises(ModelError, match="refused the request"):
            ask(model)
    assert len(fake.seen) == 1
    assert sleeps.waits == []


@pytest.mark.parametrize(
    ("provider", "answer"),
    [
        (
            "anthropic",
            {
                "id": "m",
                "type": "message",
                "role": "assistant",
                "model": "claude-haiku-4-5",
                "content": [{"type": "text", "text": "The answer is"}],
                "stop_reason": "max_tokens",
                "stop_sequence": None,
                "usage": {"input_tokens": 10, "output_tokens": 4096},
            },
        ),
        (
            "openai",
            {
                "id": "c",
                "object": "chat.completion",
                "created": 0,
                "model": "gpt-4.1",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "The answer is"},
                        "finish_reason": "length",
                    }
                ],
                "usage": {"prompt_tokens": 10, "completion_tokens": 4096, "total_tokens": 4106},
            },
        ),
    ],
)
def test_a_reply_cut_off_is_not_taken_for_an_answer(provider: str, answer: dict[str, Any]) -> None:
    """A reply stopped by the token limit is a ModelError, never a truncated final answer."""
    fake = FakeProvider(provider, lambda turn: answer)
    with serving(fake):
        model = provider_model(provider, fake.base_url, log=None)
        with pytest.raises(ModelError, match="cut off"):
            ask(model)
    assert len(fake.seen) == 1


def test_an_unreachable_api_is_retried_then_reported(caplog: pytest.LogCaptureFixture) -> None:
    """A refused connection is retried like any transient failure, then named."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sleeps = Sleeps(caplog)
    retry = Retry(attempts=2, jitter=no_jitter)
    model = provider_model("openai", f"http://127.0.0.1:{port}/v1", retry=retry)
    with pytest.raises(ModelError, match="could not reach") as raised:
        ask(model)
    assert sleeps.waits == [1.0]
    assert "after 2 attempts" in str(raised.value)


def test_a_model_error_leaves_the_saved_state_as_it_was(tmp_path: Path) -> None:
    """A provider failure at turn 2 saves nothing; resuming later asks for turn 2 and goes on."""
    world = World.create(tmp_path / "world", M1)
    store_dir = tmp_path / "runs"
    run_id = new_run_id(M1)
    fake = FakeProvider("anthropic", recorded_answer("anthropic", recorded_turns()))
    fake.errors[2] = failing("anthropic", 401, 1)

    async def run_then_resume() -> None:
        first = provider_model("anthropic", fake.base_url, log=world.model_log)
        store = FileStore(store_dir)
        agent = build_agent(world=world, store=store, approver=PolicyApprover(), model=first)
        try:
            with pytest.raises(ModelError):
                await agent.run(load_task(M1).description, run_id=run_id)
            state = store.read_sync(run_id)
            assert (state.phase, state.turns, state.stop_reason) == (Phase.MODEL, 1, None)
            second = provider_model("anthropic", fake.base_url, log=world.model_log)
            again = build_agent(
                world=world,
                store=store,
                approver=PolicyApprover(),
                model=second,
                limits=Limits(max_turns=2),
            )
            with pytest.raises(TurnLimit):
                await again.resume(run_id)
            assert store.read_sync(run_id).turns == 2
            await close(second)
        finally:
            await close(first)
            store.close_sync()

    with serving(fake):
        asyncio.run(run_then_resume())
    assert fake.turns() == [1, 2, 2]


@pytest.mark.parametrize(
    ("provider", "header", "value", "wait"),
    [("anthropic", "retry-after", "7", 7.0), ("openai", "retry-after-ms", "2500", 2.5)],
)
def test_a_rate_limit_waits_as_long_as_the_provider_asks(
    provider: str,
    header: str,
    value: str,
    wait: float,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """429 with retry-after (Anthropic, seconds) or retry-after-ms (OpenAI) sets the wait."""
    sleeps = Sleeps(caplog)
    fake = FakeProvider(provider, recorded_answer(provider, recorded_turns()))
    fake.errors[1] = failing(provider, 429, 1, **{header: value})
    with serving(fake):
        model = provider_model(provider, fake.base_url, retry=Retry(jitter=no_jitter))
        reply = ask(model)
    assert [call.name for call in reply.calls] == ["list_reports"]
    assert sleeps.waits == [wait]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_stream_that_fails_midway_is_asked_again(
    provider: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An error event, then a connection closed, in the middle of a stream: two waits, one reply."""
    sleeps = Sleeps(caplog)
    fake = FakeProvider(provider, recorded_answer(provider, recorded_turns()))
    fake.errors[1] = [(200, STREAM_ERROR, {}), (200, STREAM_CUT, {})]
    with serving(fake):
        model = provider_model(provider, fake.base_url, retry=Retry(jitter=no_jitter))
        reply = ask(model)
    assert [call.name for call in reply.calls] == ["list_reports"]
    assert len(fake.seen) == 3
    assert sleeps.waits == [1.0, 2.0]


CUT_ARGUMENTS = '{"title": "Crash when a todo is marked done after'
"""The start of a file_issue call's arguments, where the output limit cut them."""


def too_long(provider: str) -> Answer:
    """The provider's answer to a prompt longer than the model's context window."""
    if provider == "anthropic":
        message = "prompt is too long: 215000 tokens > 200000 maximum"
        return (
            400,
            {"type": "error", "error": {"type": "invalid_request_error", "message": message}},
            {},
        )
    error = {
        "message": "This model's maximum context length is 128000 tokens. However, your "
        "messages resulted in 130000 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
    return 400, {"error": error}, {}


def stopped(provider: str, turn: int, how: str) -> dict[str, Any]:
    """Recorded turn ``turn`` stopped by the provider: ``refusal`` or ``cut`` mid-arguments."""
    answer = recorded_answer(provider, recorded_turns())(turn)
    if provider == "anthropic":
        if how == "refusal":
            answer["content"] = [{"type": "text", "text": "I can't help with that."}]
            answer["stop_reason"] = "refusal"
        else:
            first = next(b for b in answer["content"] if b["type"] == "tool_use")
            text = [b for b in answer["content"] if b["type"] == "text"]
            answer["content"] = [*text, {**first, "partial_json": CUT_ARGUMENTS}]
            answer["stop_reason"] = "max_tokens"
        return answer
    choice = answer["choices"][0]
    if how == "refusal":
        choice["message"] = {"role": "assistant", "content": None}
        choice["finish_reason"] = "content_filter"
    else:
        first = choice["message"]["tool_calls"][0]
        first["function"]["arguments"] = CUT_ARGUMENTS
        choice["message"]["tool_calls"] = [first]
        choice["finish_reason"] = "length"
    return answer


EXPECTED = {
    "context": ("context window", "context_policy"),
    "overloaded": ("overloaded", "after 2 attempts", "resume it later"),
    "refusal": ("refused to answer", "change the task"),
    "cut": ("cut off at", "in the middle of the arguments", "was not run", "larger max_tokens"),
}


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("kind", list(EXPECTED))
def test_a_provider_error_at_turn_5_is_named_and_leaves_the_run_saved(
    tmp_path: Path,
    provider: str,
    kind: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Context overflow, overload, refusal or a cut-off call: a ModelError saying what to do,
    four saved turns, no issue filed; a context overflow resumed with a policy finishes.
    """
    world = World.create(tmp_path / "world", M1)
    store_dir = tmp_path / "runs"
    run_id = new_run_id(M1)
    recorded = recorded_answer(provider, recorded_turns())
    failure = kind in ("refusal", "cut")
    fake = FakeProvider(
        provider,
        lambda turn: stopped(provider, turn, kind) if failure and turn == 5 else recorded(turn),
    )
    if kind == "context":
        fake.errors[5] = [too_long(provider)]
    elif kind == "overloaded":
        fake.errors[5] = failing(provider, OVERLOADED[provider], 2, **{"retry-after": "3"})
    sleeps = Sleeps(caplog)
    store = FileStore(store_dir)
    with serving(fake):
        retry = Retry(attempts=2, jitter=no_jitter)
        model = provider_model(provider, fake.base_url, retry=retry)
        agent = build_agent(world=world, store=store, approver=PolicyApprover(), model=model)

        async def run() -> None:
            try:
                await agent.run(load_task(M1).description, run_id=run_id)
            finally:
                await close(model)

        try:
            with pytest.raises(ModelError) as raised:
                asyncio.run(run())
            state = store.read_sync(run_id)
        finally:
            store.close_sync()
    message = str(raised.value)
    print(f"\n{provider} {kind}: {message}")
    for words in EXPECTED[kind]:
        assert words in message
    assert fake.turns().count(5) == (2 if kind == "overloaded" else 1)
    assert sleeps.waits == ([3.0] if kind == "overloaded" else [])
    assert (state.turns, state.phase, state.stop_reason) == (4, Phase.MODEL, None)
    assert [m.turn for m in state.messages if isinstance(m, AssistantMessage)] == [1, 2, 3, 4]
    assert world.tracker().issues() == []  # the cut-off file_issue call never ran
    if kind == "context":
        resume_with_a_context_policy(tmp_path, provider, world, run_id)


def resume_with_a_context_policy(tmp_path: Path, provider: str, world: World, run_id: str) -> None:
    """Resume a run that overflowed the context window, with a policy: it sends less, and ends."""
    final = recorded_answer(provider, recorded_turns())(11)
    fake = FakeProvider(provider, lambda turn: final)
    store = FileStore(tmp_path / "runs")
    with serving(fake):
        model = provider_model(provider, fake.base_url)
        agent = build_agent(
            world=World.open(world.root),
            store=store,
            approver=PolicyApprover(),
            model=model,
        )
        agent.context_policy = ContextPolicy(max_messages=6, keep=3)

        async def resume() -> None:
            try:
                await agent.resume(run_id)
            finally:
                await close(model)

        try:
            asyncio.run(resume())
            state = store.read_sync(run_id)
        finally:
            store.close_sync()
    assert state.phase is Phase.DONE
    assert state.summary is not None
    sent = fake.seen[0].body["messages"]
    first_user = next(m for m in sent if m["role"] == "user")
    content = first_user["content"]
    text = content if isinstance(content, str) else content[0]["text"]
    assert text.startswith("Summary of the earlier part of this conversation")


def test_a_retry_after_date_is_read_as_the_seconds_until_it() -> None:
    """retry-after may be an HTTP date (RFC 9110): the wait is the time left until it."""
    when = email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=20), usegmt=True)
    answer = SimpleNamespace(response=SimpleNamespace(headers={"retry-after": when}))
    wait = _retry_after(answer)
    assert wait is not None
    assert 17.0 <= wait <= 20.0
    garbage = SimpleNamespace(response=SimpleNamespace(headers={"retry-after": "soon"}))
    assert _retry_after(garbage) is None
