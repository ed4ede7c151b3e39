"""Every dollar counted, and a budget that is never passed; a person's pause is not a crash loop."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest
from _loop_world import ANSWER, TASK, Job, Toolset, World, answer, reply, resume, start
from typing_extensions import override

import durably
from durably import DEFER, Limits, Phase, Price, Reply, Usage
from durably.approval import PolicyApprover, ResolveRequest
from durably.faults import CrashPlan
from durably.models.replay import load_recording
from durably.stores.journal import JournalStore
from durably.triage.agent import build_agent, recording_path
from durably.triage.world import TASKS
from durably.triage.world import World as TriageWorld

DOLLAR_A_TURN = Price(input=10_000.0, output=0.0)
"""The scripted replies use 100 input tokens: each turn costs $1.00."""

LONG = (
    *(reply((f"r{turn}", "read", f'{{"item": "item{turn}"}}')) for turn in range(1, 6)),
    answer(),
)


def test_a_run_killed_after_every_reply_arrives_stops_at_its_dollar_budget(world: World) -> None:
    """A run SIGKILLed after each reply arrives but before it is saved, 20 times in a row, counts
    every lost reply at its worst case and stops at max_dollars instead of passing it.
    """
    job = Job(replies=LONG, price=DOLLAR_A_TURN, limits=Limits(max_dollars=15.5, max_resumes=100))
    lost_reply = CrashPlan(label="loop.reply_received")

    first = start(world, job, plan=lost_reply)
    restarts = [resume(world, job, plan=lost_reply) for _ in range(19)]

    outcomes = [c.returncode if c.killed else c.error for c in (first, *restarts)]
    assert outcomes == [-9] * 15 + ["DollarLimit"] * 5
    assert "could cost up to $1.0000" in restarts[-1].message
    paid = world.model_turns()
    assert paid == [1] * 15  # what the provider billed: $15.00 of a $15.50 budget
    state = world.state()
    assert (state.dollars, state.unsaved_dollars, state.unsaved_replies) == (0.0, 15.0, 15)
    assert (state.spent, state.stop_reason, state.model_call) == (15.0, "dollar-limit", None)

    more = replace(job, limits=Limits(max_dollars=100.0, max_resumes=100))
    done = asyncio.run(more.agent(world).resume(state.run_id))
    assert (done.status, done.answer, done.state.spent) == ("done", ANSWER, 21.0)


class Defers(durably.ScriptedApprover):
    """A policy that leaves every in-doubt question to a person (like ``--approve off``)."""

    @override
    async def resolve(self, request: ResolveRequest) -> object:  # type: ignore[override]
        self._record("resolve", request.call_id)
        return DEFER


def test_a_paused_run_opened_20_times_is_not_restarting_and_still_resumes(world: World) -> None:
    """Opening a run whose last save was a pause counts no restart and saves nothing: after 20
    such opens it still resumes, and a person's answer finishes it.
    """
    job = Job(
        replies=(reply(("w1", "write", '{"note": "refund A1"}')), answer()),
        toolset=Toolset(write_lookup="unknown"),
        approver_class=Defers,
    )
    assert start(world, job, plan=CrashPlan(label="loop.tool_returned:write")).killed
    first = asyncio.run(job.agent(world).resume(world.run_id()))
    assert (first.status, first.state.resumes) == ("paused", 1)  # that open was a restart
    paused = world.state()

    again = [asyncio.run(job.agent(world).resume(paused.run_id)) for _ in range(20)]

    assert {(o.status, o.state.resumes) for o in again} == {("paused", 1)}
    assert world.state() == paused  # not even a save
    done = asyncio.run(
        job.agent(world).resume(paused.run_id, decisions={"w1": durably.Done("filed 1: A1")})
    )
    assert (done.status, done.answer, done.state.resumes) == ("done", ANSWER, 1)
    assert len(world.receiver().effects("write")) == 1


def test_max_resumes_says_how_many_restarts_where_the_run_stood_and_how_to_go_on(
    world: World,
) -> None:
    """MaxResumes names the count, the last save's phase and turn, and the --max-resumes flag."""
    job = Job(replies=LONG, limits=Limits(max_resumes=2))
    lost_reply = CrashPlan(label="loop.reply_received")
    assert start(world, job, plan=lost_reply).killed
    assert all(resume(world, job, plan=lost_reply).killed for _ in range(2))

    third = resume(world, job)

    assert third.error == "MaxResumes"
    assert "restarted 3 times, past max_resumes=2" in third.message
    assert (
        "its last save before this open: phase model at turn 0, waiting for the model's "
        "reply to turn 1" in third.message
    )
    assert "durably triage --max-resumes N" in third.message


class Unscripted:
    """A model adapter with no usage bound of its own: the loop bounds each call from the
    request's size and ``max_output_tokens``. It bills about a token per four bytes.
    """

    name = "unscripted"
    max_output_tokens = 400
    price = Price(input=3.0, output=15.0, cache_write=3.75, cache_read=0.3)

    def __init__(self) -> None:
        self.billed = 0.0

    def dollars(self, usage: Usage) -> float:
        """Dollars for ``usage`` at the model's price."""
        return self.price.dollars(usage)

    async def reply(self, request: durably.ModelRequest) -> Reply:
        """A reply of the full output size, with one call, for any request."""
        size = len(json.dumps([str(m) for m in request.messages])) + len(request.system)
        usage = Usage(input_tokens=size // 4 + 300, output_tokens=self.max_output_tokens)
        self.billed += self.dollars(usage)
        calls = [durably.Call(f"c{request.turn}", "read", '{"item": "x"}')]
        return Reply(text="x" * 2000, calls=calls, usage=usage)


def test_a_model_without_a_usage_bound_never_bills_past_the_budget(world: World) -> None:
    """For a model that only declares max_output_tokens, the bound from the request's size still
    stops the run before a call that could pass max_dollars.
    """
    model = Unscripted()
    agent = Job(replies=(), limits=Limits(max_dollars=0.5)).agent(world, model=model)

    with pytest.raises(durably.DollarLimit, match="could cost up to"):
        asyncio.run(agent.run(TASK, name="job"))

    state = world.state()
    assert state.turns > 5  # the bound is not so loose that it stops at once
    assert model.billed == pytest.approx(state.spent)
    assert state.spent <= 0.5


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
def test_a_triage_run_with_a_budget_just_below_its_cost_never_spends_past_it(
    tmp_path: Path, task: str
) -> None:
    """Each triage task, given a budget a hair below what its recording costs, stops with
    DollarLimit before the last reply, having spent (and been billed) no more than the budget.
    """
    recording = load_recording(recording_path(task))
    price = Price(**{f: getattr(recording.price, f) for f in recording.price.__struct_fields__})
    per_turn = [price.dollars(turn.usage) for turn in recording.turns]
    full = sum(per_turn)
    budget = full - per_turn[-1] / 2
    world = TriageWorld.create(tmp_path / "world", task)
    store = JournalStore(tmp_path / "runs", sync=False)
    agent = build_agent(
        world=world,
        store=store,
        approver=PolicyApprover(),
        limits=Limits(max_turns=40, max_dollars=budget),
        sync=False,
    )
    try:
        with pytest.raises(durably.DollarLimit) as stopped:
            asyncio.run(agent.run(world.load_task().description, name=task))
        state = store.read_sync(store.list_runs_sync()[0])
    finally:
        store.close_sync()

    billed = sum(per_turn[t - 1] for t in durably.CallLog(world.model_log).turns())
    assert state.spent <= budget
    assert billed <= budget
    assert (state.turns, state.phase) == (len(per_turn) - 1, Phase.MODEL)
    assert stopped.value.next_call == pytest.approx(per_turn[-1])
