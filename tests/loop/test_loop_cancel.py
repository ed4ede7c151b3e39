"""Cancellation: a cancelled run leaves on disk exactly where it stopped, and goes on from there."""

from __future__ import annotations

import asyncio
import errno
import threading
from typing import Any

import pytest
from _loop_world import ANSWER, TASK, Job, World, answer, calls, reply, tool_results
from typing_extensions import override

import durably
from _helpers.patience import stretched
from durably import Agent, Effect, FileStore, Phase, ScriptedModel, ToolContext
from durably._sysio import FileSystem
from durably.models import ModelRequest, Reply
from durably.stores import RunHandle

ONE_READ = (reply(("r1", "read", '{"item": "widgets"}')), answer())
ONE_KEYED = (reply(("k1", "refund", '{"order": "A1"}')), answer())


class GatedFileSystem(FileSystem):
    """The real file system, except that the next fsync after ``arm()`` waits for ``release``."""

    def __init__(self) -> None:
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()

    @override
    def fsync(self, fd: int) -> None:
        if self.armed:
            self.armed = False
            self.entered.set()
            if not self.release.wait(
                timeout=stretched(30)
            ):  # a guard against a hung test, not a clock
                raise OSError(errno.EIO, "the test never released the fsync")
        super().fsync(fd)


class ArmingModel(ScriptedModel):
    """Arms the gate as it hands back turn 1, so the reply's save is the one held."""

    def __init__(self, replies: tuple[Reply, ...], gate: GatedFileSystem, **kwargs: Any) -> None:
        super().__init__(replies, **kwargs)
        self.gate = gate

    @override
    async def reply(self, request: ModelRequest) -> Reply:
        answer = await super().reply(request)
        self.gate.armed = request.turn == 1
        return answer


class StallingModel(ScriptedModel):
    """Answers from the script, but never answers ``stall_turn``: only a cancel ends that call."""

    def __init__(self, replies: tuple[Reply, ...], *, stall_turn: int, **kwargs: Any) -> None:
        super().__init__(replies, **kwargs)
        self.stall_turn = stall_turn
        self.asked = asyncio.Event()

    @override
    async def reply(self, request: ModelRequest) -> Reply:
        if request.turn == self.stall_turn:
            self.asked.set()
            await asyncio.Event().wait()
        return await super().reply(request)


class WatchedHandle:
    """A run handle that notes how each save ended for the loop: ``saved`` or ``abandoned``."""

    def __init__(self, inner: RunHandle, outcomes: list[str]) -> None:
        self.inner = inner
        self.outcomes = outcomes

    @property
    def run_id(self) -> str:
        """The watched run's ID."""
        return self.inner.run_id

    async def save(self, state: durably.RunState) -> None:
        """Save through the inner handle, noting whether the save finished or was abandoned."""
        try:
            await self.inner.save(state)
        except asyncio.CancelledError:
            self.outcomes.append("abandoned")
            raise
        self.outcomes.append("saved")

    async def close(self) -> None:
        """Close the inner handle."""
        await self.inner.close()

    async def __aenter__(self) -> WatchedHandle:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class WatchedStore:
    """A file store whose handles are watched (see :class:`WatchedHandle`)."""

    def __init__(self, inner: FileStore) -> None:
        self.inner = inner
        self.outcomes: list[str] = []

    async def create(self, state: durably.RunState) -> WatchedHandle:
        """Create the run in the inner store, watched."""
        return WatchedHandle(await self.inner.create(state), self.outcomes)

    async def open(self, run_id: str) -> tuple[WatchedHandle, durably.RunState]:
        """Open the run in the inner store, watched."""
        handle, state = await self.inner.open(run_id)
        return WatchedHandle(handle, self.outcomes), state

    async def read(self, run_id: str) -> durably.RunState:
        """Read the run from the inner store."""
        return await self.inner.read(run_id)

    async def list_runs(self) -> list[str]:
        """The inner store's runs."""
        return await self.inner.list_runs()

    def describe(self, run_id: str) -> str:
        """The inner store's description of the run."""
        return self.inner.describe(run_id)

    async def close(self) -> None:
        """Close the inner store."""
        await self.inner.close()

    async def __aenter__(self) -> WatchedStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def refund_tool(world: World, *, stall: asyncio.Event | None) -> durably.Tool:
    """A keyed refund that, when ``stall`` is given, sets it and then waits for ever."""
    receiver = world.receiver()

    @durably.tool(effect=Effect.KEYED, key_ttl=durably.NEVER_EXPIRES)
    async def refund(ctx: ToolContext, order: str) -> str:
        """Refund an order."""
        if stall is not None:
            stall.set()
            await asyncio.Event().wait()
        return receiver.keyed(call_id=ctx.call_id, key=ctx.idempotency_key, payload=order, ttl=None)

    return refund


async def cancel_when(task: asyncio.Task[Any], ready: asyncio.Event) -> None:
    """Cancel ``task`` once ``ready`` is set, and wait for the cancellation to come out of it."""
    await ready.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_a_cancel_during_a_tool_call_leaves_its_marker_saved(world: World) -> None:
    """A run cancelled while a call runs has that call's marker on disk, so a resume resolves it."""
    stall = asyncio.Event()
    model = ScriptedModel(ONE_KEYED, log=world.model_log)
    agent = Agent(
        model=model, tools=[refund_tool(world, stall=stall)], store=world.store(), clock=world.now
    )

    async def scenario() -> None:
        await cancel_when(asyncio.create_task(agent.run(TASK, name="job")), stall)

    asyncio.run(scenario())

    stopped = world.state()
    assert (stopped.phase, list(stopped.markers), tool_results(stopped)) == (
        Phase.TOOLS,
        ["k1"],
        [],
    )
    healthy = Agent(
        model=model, tools=[refund_tool(world, stall=None)], store=world.store(), clock=world.now
    )
    done = asyncio.run(healthy.resume(stopped.run_id))
    assert (done.answer, done.state.resolutions["k1"].step) == (ANSWER, 1)
    assert len(world.receiver().effects()) == 1


def test_a_cancel_during_a_model_call_leaves_the_run_before_that_call(world: World) -> None:
    """A run cancelled while the model thinks is saved in phase model, and the resume asks again."""
    job = Job(replies=(*ONE_READ[:1], reply(("r2", "read", '{"item": "gadgets"}')), answer()))
    model = StallingModel(job.replies, stall_turn=2, log=world.model_log)
    agent = job.agent(world, model=model)

    async def scenario() -> None:
        await cancel_when(asyncio.create_task(agent.run(TASK, name="job")), model.asked)

    asyncio.run(scenario())

    stopped = world.state()
    assert (stopped.phase, stopped.turns, [r[0] for r in tool_results(stopped)]) == (
        Phase.MODEL,
        1,
        ["r1"],
    )
    done = asyncio.run(job.agent(world).resume(stopped.run_id))
    assert done.answer == ANSWER
    assert world.model_turns() == [1, 2, 3]


def test_a_cancel_during_a_save_lets_that_save_finish(world: World) -> None:
    """A cancel arriving while the reply is saved waits for that save: the disk holds the reply."""
    gate = GatedFileSystem()
    job = Job(replies=ONE_READ)
    files = FileStore(world.runs, fs=gate)  # sync on: the gate sits in the fsync
    store = WatchedStore(files)
    model = ArmingModel(job.replies, gate, log=world.model_log)
    agent = job.agent(world, model=model, store=store)

    async def scenario() -> None:
        task = asyncio.create_task(agent.run(TASK, name="job"))
        assert await asyncio.to_thread(gate.entered.wait, 30)
        task.cancel()
        gate.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(scenario())
    finally:
        files.close_sync()

    # The model-call marker, then the reply's save, held at its fsync and not abandoned.
    assert store.outcomes == ["saved", "saved"]
    saved = world.state()
    assert (saved.phase, saved.turns, [c.id for c in calls(saved)]) == (Phase.TOOLS, 1, ["r1"])
    assert world.receiver().entries() == []  # the cancellation stopped the run before any call
