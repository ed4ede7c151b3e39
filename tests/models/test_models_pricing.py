"""Prices: the table's figures, usage mapped without double counting, no silent zero."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import openai
import pytest
from _models_fakes import FakeProvider, close, provider_model, recorded_turns, serving

from durably import Model, ModelError, ModelRequest, Price, Reply, Usage
from durably.models.anthropic import AnthropicModel
from durably.models.openai import OpenAIModel
from durably.state import UserMessage

MILLION = 1_000_000
OFFLINE = "http://127.0.0.1:9"
"""A base URL the tests in this file never call."""


def claude(name: str, price: Price | None = None) -> AnthropicModel:
    """An Anthropic model whose client is never used."""
    client = anthropic.AsyncAnthropic(api_key="test", base_url=OFFLINE)
    return AnthropicModel(name, client=client, price=price)


def gpt(name: str, price: Price | None = None) -> OpenAIModel:
    """An OpenAI model whose client is never used."""
    client = openai.AsyncOpenAI(api_key="test", base_url=OFFLINE)
    return OpenAIModel(name, client=client, price=price)


def test_claude_prices_follow_the_table_for_every_kind_of_token() -> None:
    """A million tokens of each kind cost Haiku 4.5's list price, snapshot or alias."""
    every = Usage(
        input_tokens=MILLION,
        output_tokens=MILLION,
        cache_read_tokens=MILLION,
        cache_write_tokens=MILLION,
    )
    assert claude("claude-haiku-4-5").dollars(every) == pytest.approx(1.0 + 5.0 + 0.10 + 1.25)
    assert claude("claude-haiku-4-5-20251001").dollars(every) == pytest.approx(7.35)
    assert claude("claude-sonnet-4-5-20250929").dollars(
        Usage(input_tokens=MILLION, output_tokens=MILLION)
    ) == pytest.approx(18.0)


def test_the_recorded_m1_run_costs_what_gpt_4_1_charges() -> None:
    """The m1 recording's usage, priced as gpt-4.1, is $2 per million in and $8 out."""
    usage = sum((turn.usage for turn in recorded_turns()), Usage())
    expected = (usage.input_tokens * 2.0 + usage.output_tokens * 8.0) / MILLION
    assert gpt("gpt-4.1-2025-04-14").dollars(usage) == pytest.approx(expected)
    assert expected > 0


@pytest.mark.parametrize(
    ("build", "name"),
    [(claude, "claude-imaginary-9"), (gpt, "gpt-imaginary-9"), (gpt, "gpt-4o-2024-05-13")],
)
def test_a_model_without_a_known_price_is_refused_at_construction(build: Any, name: str) -> None:
    """An unknown model with no price= is a ModelError naming the fix, never a free run."""
    with pytest.raises(ModelError, match=r"no price for model .*pass price=durably\.Price"):
        build(name)


def test_an_explicit_price_prices_any_model() -> None:
    """price= is used as given, for models the table does not know."""
    model = gpt("gpt-imaginary-9", price=Price(input=1.0, output=2.0, cache_read=0.5))
    usage = Usage(input_tokens=MILLION, output_tokens=MILLION, cache_read_tokens=MILLION)
    assert model.dollars(usage) == pytest.approx(3.5)


def usage_of(provider: str, answer: dict[str, Any]) -> Reply:
    """The reply a fake provider's single answer turns into."""
    fake = FakeProvider(provider, lambda turn: answer)
    request = ModelRequest(
        run_id="r", turn=1, system="", messages=(UserMessage(text="hi"),), tools=()
    )

    async def go(model: Model) -> Reply:
        try:
            return await model.reply(request)
        finally:
            await close(model)

    with serving(fake):
        return asyncio.run(go(provider_model(provider, fake.base_url)))


def test_openai_cached_tokens_are_not_counted_twice() -> None:
    """prompt_tokens includes cached ones: they become cache reads, the rest input."""
    reply = usage_of(
        "openai",
        {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "gpt-4.1",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "hi"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": 1000,
                "completion_tokens": 50,
                "total_tokens": 1050,
                "prompt_tokens_details": {"cached_tokens": 400},
            },
        },
    )
    assert reply.usage == Usage(input_tokens=600, output_tokens=50, cache_read_tokens=400)
    assert gpt("gpt-4.1").dollars(reply.usage) == pytest.approx(
        (600 * 2.0 + 50 * 8.0 + 400 * 0.5) / MILLION
    )


def test_anthropic_cache_reads_and_writes_are_kept_apart() -> None:
    """cache_read_input_tokens and cache_creation_input_tokens map to cache read and write."""
    reply = usage_of(
        "anthropic",
        {
            "id": "m",
            "type": "message",
            "role": "assistant",
            "model": "claude-haiku-4-5-20251001",
            "content": [{"type": "text", "text": "hi"}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": 20,
                "output_tokens": 5,
                "cache_read_input_tokens": 3000,
                "cache_creation_input_tokens": 700,
            },
        },
    )
    assert reply.usage == Usage(
        input_tokens=20, output_tokens=5, cache_read_tokens=3000, cache_write_tokens=700
    )
    assert reply.model == "claude-haiku-4-5-20251001"
    assert reply.text == "hi"
