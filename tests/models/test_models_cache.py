"""Prompt caching: m1 through each SDK costs less cached, and a resumed run still hits the cache.

The fake provider keeps a prompt cache keyed by the exact bytes of each prefix
(see ``PromptCache`` in ``_models_fakes``), so a cache read is proof that a
request repeated what an earlier one sent, byte for byte.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from _models_fakes import (
    M1,
    OPENAI_STEP,
    CacheUse,
    FakeProvider,
    close,
    m1_fake,
    provider_model,
    recorded_turns,
    serving,
)

from _helpers.patience import stretched
from durably import FileStore, Limits, PolicyApprover, TurnLimit, Usage, new_run_id
from durably.state import AssistantMessage
from durably.triage.agent import build_agent
from durably.triage.world import World, load_task

PROVIDERS = ("anthropic", "openai")
CHILD = Path(__file__).with_name("_models_child.py")
PROMPTS = [turn.usage.input_tokens for turn in recorded_turns()]
"""Every input token of each recorded m1 turn, cached or not."""


@dataclass(frozen=True)
class Priced:
    """What one m1 run cost, turn by turn."""

    dollars: float
    usage: list[Usage]
    uses: list[CacheUse]


def run_m1(tmp_path: Path, provider: str, *, cache: bool) -> Priced:
    """m1 to its end through the real SDK; ``cache`` switches caching on both sides."""
    world = World.create(tmp_path / "world", M1)
    fake = m1_fake(provider, cache=cache)
    store = FileStore(tmp_path / "runs")
    with serving(fake):
        model = provider_model(provider, fake.base_url, cache=cache)
        agent = build_agent(world=world, store=store, approver=PolicyApprover(), model=model)

        async def go() -> None:
            try:
                await agent.run(load_task(M1).description, run_id=new_run_id(M1))
            finally:
                await close(model)

        try:
            asyncio.run(go())
            run_id = store.list_runs_sync()[0]
            state = store.read_sync(run_id)
        finally:
            store.close_sync()
    usage = [m.usage for m in state.messages if isinstance(m, AssistantMessage)]
    return Priced(dollars=state.dollars, usage=usage, uses=fake.cache.uses if fake.cache else [])


def expected_reads(provider: str) -> list[int]:
    """What each turn of m1 reads from the cache: all the previous turn sent, once cacheable.

    Anthropic (Claude Haiku 4.5) caches a prefix of 4096 tokens or more, so turn 4
    writes the first entry and every later turn reads its predecessor's whole prompt.
    OpenAI caches from 1024 tokens, and reads in steps of 128 tokens.
    """
    if provider == "anthropic":
        return [0] + [p if p >= 4096 else 0 for p in PROMPTS[:-1]]
    return [0] + [p // OPENAI_STEP * OPENAI_STEP for p in PROMPTS[:-1]]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_m1_costs_less_with_the_prompt_cache(tmp_path: Path, provider: str) -> None:
    """Each turn reads the previous turn's prompt from the cache, and the run costs less."""
    cached = run_m1(tmp_path / "cached", provider, cache=True)
    plain = run_m1(tmp_path / "plain", provider, cache=False)
    reads = [u.cache_read_tokens for u in cached.usage]
    print(
        f"\n{provider}: m1 ${cached.dollars:.6f} with caching, ${plain.dollars:.6f} without "
        f"({1 - cached.dollars / plain.dollars:.0%} less)"
    )
    for turn, usage in enumerate(cached.usage, start=1):
        print(
            f"  turn {turn:2}: prompt {PROMPTS[turn - 1]:6}  cache read {usage.cache_read_tokens:6}"
            f"  cache write {usage.cache_write_tokens:6}  uncached {usage.input_tokens:6}"
        )
    assert reads == expected_reads(provider)
    assert [u.cache_read_tokens for u in plain.usage] == [0] * len(PROMPTS)
    for usage, prompt in zip(cached.usage, PROMPTS, strict=True):
        assert usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens == prompt
    assert cached.dollars < plain.dollars


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize(
    ("label", "asked_again"),
    [("loop.reply_received", True), ("loop.saved.reply", False)],
    ids=["before-save-2", "after-save-2"],
)
def test_a_resumed_run_reads_what_the_dead_process_cached(
    tmp_path: Path, provider: str, label: str, asked_again: bool
) -> None:
    """A run SIGKILLed around save point 2 of turn 5 resumes with a request the cache knows."""
    world = World.create(tmp_path / "world", M1)
    store_dir = tmp_path / "runs"
    run_id = new_run_id(M1)
    fake: FakeProvider = m1_fake(provider)
    assert fake.cache is not None
    with serving(fake):
        child = subprocess.run(
            [
                *(sys.executable, str(CHILD), provider, fake.base_url),
                *(str(world.root), str(store_dir), run_id, label, "5"),
            ],
            capture_output=True,
            text=True,
            timeout=stretched(60),
            check=False,
        )
        assert child.returncode == -signal.SIGKILL, child.stderr
        assert fake.turns() == [1, 2, 3, 4, 5]

        model = provider_model(provider, fake.base_url)
        store = FileStore(store_dir)
        agent = build_agent(
            world=World.open(world.root),
            store=store,
            approver=PolicyApprover(),
            model=model,
            limits=Limits(max_turns=6),
        )

        async def resume() -> None:
            try:
                await agent.resume(run_id)
            finally:
                await close(model)

        try:
            with pytest.raises(TurnLimit):
                asyncio.run(resume())
        finally:
            store.close_sync()

    resumed = fake.cache.uses[5:]
    expected = [5, 6] if asked_again else [6]
    assert [use.turn for use in resumed] == expected
    # The first request of the new process reads everything the dead process's last one sent
    # (Anthropic: exactly; OpenAI: in its steps of 128 tokens).
    everything = PROMPTS[4] if provider == "anthropic" else PROMPTS[4] // OPENAI_STEP * OPENAI_STEP
    print(
        f"\n{provider} {label}: after the resume, turn {resumed[0].turn} read "
        f"{resumed[0].read} of {resumed[0].prompt} prompt tokens from the cache"
    )
    assert resumed[0].read == everything
    if asked_again:
        assert resumed[0].written == 0
        assert resumed[1].read == everything  # turn 6 reads the same prefix again
