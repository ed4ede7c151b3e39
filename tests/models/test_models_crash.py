"""A provider's reply and save point 2: what a crash on either side of it costs.

The child process runs m1 against a fake provider in this process and is
SIGKILLed at a crash point of turn 2; this process then resumes the run with
a fresh client, while the fake counts the requests for each turn.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _models_fakes import (
    M1,
    FakeProvider,
    close,
    provider_model,
    recorded_answer,
    recorded_turns,
    serving,
)

from _helpers.patience import stretched
from durably import (
    CallLog,
    FileStore,
    Limits,
    Model,
    PolicyApprover,
    TurnLimit,
    new_run_id,
)
from durably.loop import Agent
from durably.state import AssistantMessage
from durably.triage.agent import build_agent
from durably.triage.world import World

CHILD = Path(__file__).with_name("_models_child.py")


async def resume(agent: Agent, model: Model, run_id: str) -> None:
    """Resume ``run_id`` and close the model's client afterwards."""
    try:
        await agent.resume(run_id)
    finally:
        await close(model)


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
@pytest.mark.parametrize(
    ("label", "asked_again"),
    [("loop.reply_received", True), ("loop.saved.reply", False)],
    ids=["before-save-2", "after-save-2"],
)
def test_a_reply_is_asked_again_only_if_it_was_not_saved(
    tmp_path: Path, provider: str, label: str, asked_again: bool
) -> None:
    """A reply lost before save point 2 is asked for again; a saved one never is."""
    world = World.create(tmp_path / "world", M1)
    store_dir = tmp_path / "runs"
    run_id = new_run_id(M1)
    fake = FakeProvider(provider, recorded_answer(provider, recorded_turns()))
    with serving(fake):
        child = subprocess.run(
            [
                *(sys.executable, str(CHILD), provider, fake.base_url),
                *(str(world.root), str(store_dir), run_id, label, "2"),
            ],
            capture_output=True,
            text=True,
            timeout=stretched(60),
            check=False,
        )
        assert child.returncode == -signal.SIGKILL, child.stderr
        assert fake.turns() == [1, 2]

        model = provider_model(provider, fake.base_url, log=world.model_log)
        store = FileStore(store_dir)
        agent = build_agent(
            world=World.open(world.root),
            store=store,
            approver=PolicyApprover(),
            model=model,
            limits=Limits(max_turns=3),
        )
        try:
            with pytest.raises(TurnLimit):
                asyncio.run(resume(agent, model, run_id))
            state = store.read_sync(run_id)
        finally:
            store.close_sync()

    assert fake.turns() == ([1, 2, 2, 3] if asked_again else [1, 2, 3])
    if asked_again:
        assert fake.seen[2].body == fake.seen[1].body  # the resumed run sends the same context
    assert CallLog(world.model_log).paid_twice(run_id) == (1 if asked_again else 0)
    saved = [m for m in state.messages if isinstance(m, AssistantMessage)]
    assert [m.turn for m in saved] == [1, 2, 3]
    assert state.resumes == 1
