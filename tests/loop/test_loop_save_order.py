"""The five save points (SPEC section 4) come in their order, each a whole store save."""

from __future__ import annotations

import asyncio

import pytest
from _loop_world import TASK, Job, Toolset, World, answer, reply

from durably import FileStore, Phase
from durably.faults import CrashPlan, installed
from durably.state import RunState
from durably.stores.file import FileRun

STORE_SAVE = [
    "store.save.temp_written",
    "store.save.temp_synced",
    "store.save.renamed",
    "store.save.dir_synced",
]


def test_the_loop_saves_start_reply_pause_attempt_result_then_the_answer(world: World) -> None:
    """A run with one approved write saves start, reply, pause, attempt, result, then the answer,
    and a model-call marker before each reply.
    """
    job = Job(
        replies=(reply(("w1", "write", '{"note": "refund A1"}')), answer()),
        toolset=Toolset(write_needs_approval=True),
    )
    plan = CrashPlan()  # no kill: only records the points reached

    with installed(plan):
        outcome = asyncio.run(job.agent(world).run(TASK, name="job"))

    saves = [label.removeprefix("loop.saved.") for label in plan.reached if "loop.saved." in label]
    assert saves == [
        "start",
        "model_call",
        "reply",
        "pause",
        "attempt",
        "result",
        "model_call",
        "reply",
    ]
    assert outcome.state.phase is Phase.DONE  # the last reply save is the done save
    # Every loop save point follows a whole store save: temp written, synced, renamed, dir synced.
    for at, label in enumerate(plan.reached):
        if label.startswith("loop.saved."):
            assert plan.reached[at - 4 : at] == STORE_SAVE
    # A reply is received, then saved, with nothing but the store's save in between.
    for at, label in enumerate(plan.reached):
        if label == "loop.reply_received":
            assert plan.reached[at + 1 : at + 6] == [*STORE_SAVE, "loop.saved.reply"]
    assert (
        plan.reached.index("loop.tool_returned:write")
        == plan.reached.index("loop.saved.attempt") + 1
    )  # the tool runs right after its marker is saved, and nothing is saved in between


def test_a_save_is_awaited_only_where_the_store_waits(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a file store that does not sync, the loop saves at once (no save is awaited); on one
    that syncs, each save after the start is awaited; the points reached are the same, in the
    same order.
    """
    job = Job(replies=(reply(("r1", "read", '{"item": "widgets"}')), answer()))
    awaited: list[bool] = []
    real = FileRun.save

    async def counted(self: FileRun, state: RunState) -> None:
        awaited.append(self._store.sync)
        await real(self, state)

    monkeypatch.setattr(FileRun, "save", counted)
    reached: dict[bool, list[str]] = {}
    for sync in (False, True):
        store = FileStore(world.runs / f"sync-{sync}", sync=sync)
        plan = CrashPlan()
        with installed(plan):
            outcome = asyncio.run(job.agent(world, store=store).run(TASK, name="job"))
        store.close_sync()
        assert outcome.state.phase is Phase.DONE
        reached[sync] = plan.reached
    saves = sum(1 for label in reached[True] if label.startswith("loop.saved."))
    assert awaited == [True] * (saves - 1)  # every save but the start (made by create)
    assert reached[False] == reached[True]
