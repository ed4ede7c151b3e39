"""The loop drives a handle its caller holds: the seam a Postgres worker (or any owner) uses."""

from __future__ import annotations

import asyncio
from typing import Self

import pytest
from _loop_world import ANSWER, TASK, Job, World, answer, reply, start

import durably
from durably.faults import CrashPlan
from durably.state import Phase, RunState, decode_state, encode_state

JOB = Job(replies=(reply(("r1", "read", '{"item": "widgets"}')), answer()))


class MemoryHandle:
    """Owns one run in memory and keeps every state saved through it, encoded."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.saved: list[bytes] = []
        self.closed = False

    async def save(self, state: RunState) -> None:
        """Keep the state's encoding."""
        self.saved.append(encode_state(state))

    async def close(self) -> None:
        """Note that the handle was closed."""
        self.closed = True

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def test_start_saves_the_first_state_through_the_handle_before_any_model_call(
    world: World,
) -> None:
    """``start`` on a handle with no state saves save point 1 through it, drives the run to its
    answer, and leaves closing the handle to its caller.
    """
    handle = MemoryHandle("queued-1")
    agent = JOB.agent(world)
    agent.store = None  # a worker's agent: it has no store, and needs none

    outcome = asyncio.run(agent.start(handle, TASK))

    first, last = decode_state(handle.saved[0]), decode_state(handle.saved[-1])
    assert (first.run_id, first.phase, first.turns, first.task) == (
        "queued-1",
        Phase.MODEL,
        0,
        TASK,
    )
    assert first.model_call is None  # saved before the model call's marker, not with it
    assert first.fingerprint == agent.fingerprint()
    assert (outcome.status, outcome.answer, outcome.run_id) == ("done", ANSWER, "queued-1")
    assert last.phase is Phase.DONE
    assert world.model_turns() == [1, 2]
    assert not handle.closed
    assert world.run_ids() == []  # nothing went to a store


def test_drive_resumes_a_killed_run_on_the_callers_handle_and_leaves_it_owned(
    world: World,
) -> None:
    """A run SIGKILLed after its first reply's save, carried on by ``drive`` on a handle the
    caller opened, counts the restart, never asks for the saved reply again, and stays owned
    by the caller until it closes the handle.
    """
    killed = start(world, JOB, plan=CrashPlan(label="loop.saved.reply"))
    assert killed.returncode == -9
    run_id = world.run_id()

    async def carry_on() -> durably.Outcome:
        store = world.store()
        handle, state = await store.open(run_id)
        async with handle:
            outcome = await JOB.agent(world).drive(handle, state)
            with pytest.raises(durably.Locked):
                await world.store().open(run_id)
        reopened, _ = await world.store().open(run_id)
        await reopened.close()
        return outcome

    outcome = asyncio.run(carry_on())

    assert (outcome.status, outcome.answer) == ("done", ANSWER)
    assert world.model_turns() == [1, 2]
    assert world.state().resumes == 1


def test_drive_refuses_a_state_of_another_run(world: World) -> None:
    """``drive`` given a state that is not its handle's run says so and saves nothing."""
    handle = MemoryHandle("run-a")
    state = RunState(run_id="run-b", task=TASK, created_at=world.now())

    with pytest.raises(ValueError, match=r"run-b.*run-a"):
        asyncio.run(JOB.agent(world).drive(handle, state))
    assert handle.saved == []


def test_an_agent_without_a_store_names_the_remedy_for_run_and_resume(world: World) -> None:
    """``run`` and ``resume`` on an agent built without a store fail before anything runs,
    naming the two ways out.
    """
    agent = JOB.agent(world)
    agent.store = None

    for attempt in (agent.run(TASK), agent.resume("some-run")):
        with pytest.raises(ValueError, match=r"store=.*Agent\.drive"):
            asyncio.run(attempt)
    assert world.model_turns() == []
