"""Limits cover a run's whole life, across every process that ran it, however it died."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from _loop_world import ANSWER, TASK, Job, World, answer, reply, resume, start

import durably
from durably import Limits, Phase, Price
from durably.faults import CrashPlan

# Five turns of one read each, then the answer on turn 6.
LONG = (
    *(reply((f"r{turn}", "read", f'{{"item": "item{turn}"}}')) for turn in range(1, 6)),
    answer(),
)


def dies_after_each_reply() -> CrashPlan:
    """A crash plan that SIGKILLs the process right after each reply is saved."""
    return CrashPlan(label="loop.saved.reply")


def test_a_run_killed_after_every_reply_still_stops_at_its_turn_limit(world: World) -> None:
    """Turns come from the state, so a run SIGKILLed after every reply stops at max_turns."""
    job = Job(replies=LONG, limits=Limits(max_turns=3))

    first = start(world, job, plan=dies_after_each_reply())
    restarts = [resume(world, job, plan=dies_after_each_reply()) for _ in range(3)]

    assert [c.returncode for c in (first, *restarts[:2])] == [-9, -9, -9]
    assert restarts[2].error == "TurnLimit"
    assert "turn limit (3 of 3)" in restarts[2].message
    state = world.state()
    assert (state.turns, state.stop_reason) == (3, "turn-limit")
    assert world.model_turns() == [1, 2, 3]


def test_a_run_killed_after_every_reply_still_stops_at_its_dollar_limit(world: World) -> None:
    """Dollars come from the state, so a run SIGKILLed after every reply stops at max_dollars,
    refusing the call that could pass it.
    """
    dollar_a_turn = Price(input=10_000.0, output=0.0)  # 100 input tokens a turn: $1.00
    job = Job(replies=LONG, limits=Limits(max_dollars=2.5), price=dollar_a_turn)

    first = start(world, job, plan=dies_after_each_reply())
    restarts = [resume(world, job, plan=dies_after_each_reply()) for _ in range(2)]

    assert [c.returncode for c in (first, restarts[0])] == [-9, -9]
    assert restarts[1].error == "DollarLimit"
    assert "could cost up to $1.0000" in restarts[1].message
    state = world.state()
    assert (state.dollars, state.turns, state.stop_reason) == (2.0, 2, "dollar-limit")
    assert world.model_turns() == [1, 2]


@pytest.mark.parametrize("limit", ["turns", "dollars"])
def test_resuming_with_a_raised_limit_continues_the_run(world: World, limit: str) -> None:
    """A run stopped by a limit, resumed by an agent with a higher one, carries on to its answer."""
    dollar_a_turn = Price(input=10_000.0, output=0.0)
    low, high = (
        (Limits(max_turns=2), Limits(max_turns=10))
        if limit == "turns"
        else (Limits(max_dollars=2.0), Limits(max_dollars=10.0))
    )
    job = Job(replies=LONG, limits=low, price=dollar_a_turn)
    with pytest.raises(durably.LimitExceeded) as stopped:
        asyncio.run(job.agent(world).run(TASK, name="job"))
    run_id = world.run_id()
    with pytest.raises(type(stopped.value)):
        asyncio.run(job.agent(world).resume(run_id))

    outcome = asyncio.run(replace(job, limits=high).agent(world).resume(run_id))

    assert (outcome.status, outcome.answer, outcome.turns) == ("done", ANSWER, 6)
    assert world.model_turns() == [1, 2, 3, 4, 5, 6]


def test_max_resumes_stops_the_eleventh_open_even_when_every_restart_dies(world: World) -> None:
    """The restart count is saved first on every open, so the 11th open raises MaxResumes."""
    job = Job(replies=LONG)
    first = start(world, job, plan=CrashPlan(label="loop.reply_received"))
    # Odd restarts die just after saving their count, even ones while asking the model.
    restarts = [
        resume(
            world,
            job,
            plan=CrashPlan(label="loop.saved.resume" if n % 2 else "loop.reply_received"),
        )
        for n in range(1, 11)
    ]
    paid = world.model_turns()

    eleventh = resume(world, job)

    assert [c.returncode for c in (first, *restarts)] == [-9] * 11
    assert eleventh.error == "MaxResumes"
    assert "restarted 11 times, past max_resumes=10" in eleventh.message
    assert world.model_turns() == paid == [1] * 6  # the 11th open made no model call
    state = world.state()
    assert (state.resumes, state.stop_reason, state.phase) == (11, "max-resumes", Phase.MODEL)

    outcome = asyncio.run(
        replace(job, limits=Limits(max_resumes=20)).agent(world).resume(state.run_id)
    )
    assert (outcome.status, outcome.answer, outcome.state.resumes) == ("done", ANSWER, 12)


def test_resuming_a_finished_run_returns_its_answer_without_any_call(world: World) -> None:
    """A done run resumed returns the saved answer and calls neither the model nor a tool."""
    job = Job(replies=LONG)
    finished = asyncio.run(job.agent(world).run(TASK, name="job"))
    paid, ledger, saved = world.model_turns(), world.receiver().entries(), world.state()

    again = asyncio.run(job.agent(world).resume(finished.run_id))

    assert (again.status, again.answer) == ("done", ANSWER)
    assert world.model_turns() == paid == [1, 2, 3, 4, 5, 6]
    assert world.receiver().entries() == ledger
    assert world.state() == saved  # not even a save


@pytest.mark.parametrize(
    ("limits", "named"),
    [
        ({"max_turns": 0}, "max_turns"),
        ({"max_tokens": -5}, "max_tokens"),
        ({"max_dollars": 0.0}, "max_dollars"),
        ({"max_dollars": -1.0}, "max_dollars"),
        ({"max_dollars": float("nan")}, "max_dollars"),
        ({"max_dollars": float("inf")}, "max_dollars"),
        ({"max_resumes": -1}, "max_resumes"),
    ],
)
def test_a_limit_no_run_could_keep_is_refused_when_it_is_made(
    limits: dict[str, float], named: str
) -> None:
    """A limit of 0 turns, a negative budget, or a NaN one (which no spend would ever
    reach) is a mistake: it is refused with the field's name before any run starts.
    """
    with pytest.raises(ValueError, match=f"Limits.{named}"):
        Limits(**limits)  # type: ignore[arg-type]


def test_the_limits_a_run_may_keep_are_accepted() -> None:
    """The smallest sensible limits, and no limits at all, are accepted."""
    assert Limits(max_turns=1, max_tokens=1, max_dollars=0.01, max_resumes=0).max_resumes == 0
    assert Limits().max_dollars is None
