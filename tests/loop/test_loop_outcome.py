"""The outcome of run and resume is made of the state only, so a resume can always rebuild it."""

from __future__ import annotations

import asyncio
import dataclasses

import msgspec
from _loop_world import ANSWER, TASK, Job, World, answer, reply

import durably
import durably.loop


def test_every_field_of_the_outcome_comes_from_the_run_state() -> None:
    """A field added to Outcome without a source in RunState fails here (SPEC section 2)."""
    outcome_fields = {f.name for f in dataclasses.fields(durably.Outcome)}
    state_fields = {f.name for f in msgspec.structs.fields(durably.RunState)}

    assert set(durably.loop.OUTCOME_SOURCES) == outcome_fields
    assert {
        source for source in durably.loop.OUTCOME_SOURCES.values() if source != "*"
    } <= state_fields


def test_the_outcome_of_a_resume_equals_the_outcome_rebuilt_from_disk(world: World) -> None:
    """What run returned is exactly what the saved state says, field by field."""
    job = Job(replies=(reply(("r1", "read", '{"item": "widgets"}')), answer()))

    outcome = asyncio.run(job.agent(world).run(TASK, name="job"))

    assert outcome == durably.Outcome.from_state(world.state())
    assert (outcome.status, outcome.answer, outcome.stop_reason, outcome.turns) == (
        "done",
        ANSWER,
        "answered",
        2,
    )
