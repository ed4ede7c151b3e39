"""A fickle model answers differently when asked again; the run follows whichever reply it saved."""

from __future__ import annotations

import pytest
from _loop_world import (
    ANSWER,
    Job,
    World,
    answer,
    calls,
    reply,
    resume,
    start,
    tool_results,
)

import durably
from durably.faults import CrashPlan

FICKLE = Job(
    replies=(
        reply(("r1", "read", '{"item": "widgets"}')),
        reply(
            ("c1", "keyed", '{"order": "A1", "cents": 500}'),
            ("c2", "keyed", '{"order": "B2", "cents": 700}'),
            ("w1", "write", '{"note": "A1 and B2 refunded"}'),
        ),
        answer(),
    ),
    fickle=True,
)


@pytest.mark.parametrize(
    ("label", "occurrence"),
    [
        ("loop.reply_received", 2),  # turn 2 arrived
        # turn 2's save: start, call 1, reply 1, result r1, call 2, reply 2
        ("store.save.temp_synced", 6),
    ],
)
def test_a_lost_reply_asked_again_of_a_fickle_model_is_followed_consistently(
    world: World, label: str, occurrence: int
) -> None:
    """A reply lost before its save is asked again; its new call IDs are the ones run and keyed."""
    crashed = start(world, FICKLE, plan=CrashPlan(label=label, occurrence=occurrence))
    assert crashed.killed
    assert world.state().turns == 1  # the turn-2 reply never reached the disk

    resumed = resume(world, FICKLE)

    assert resumed.finished()["answer"] == ANSWER
    state = world.state()
    saved_ids = [c.id for c in calls(state)]
    assert saved_ids == ["r1", "c1-again1", "c2-again1", "w1-again1"]
    assert [r[0] for r in tool_results(state)] == saved_ids
    assert world.model_turns() == [1, 2, 2, 3]
    receiver = world.receiver()
    assert [(e["call_id"], e["key"]) for e in receiver.effects("keyed")] == [
        (call_id, durably.idempotency_key(state.run_id, call_id))
        for call_id in ("c1-again1", "c2-again1")
    ]
    assert [e["call_id"] for e in receiver.effects("write")] == ["w1-again1"]
    assert all(e["kind"] != "repeat" for e in receiver.entries())


def test_a_saved_reply_is_never_asked_of_a_fickle_model_again(world: World) -> None:
    """A saved reply's calls run under their saved IDs; the fickle model is not asked again."""
    crashed = start(world, FICKLE, plan=CrashPlan(label="loop.saved.reply", occurrence=2))
    assert crashed.killed

    resumed = resume(world, FICKLE)

    assert resumed.finished()["answer"] == ANSWER
    state = world.state()
    assert [c.id for c in calls(state)] == ["r1", "c1", "c2", "w1"]
    assert world.model_turns() == [1, 2, 3]
    assert [e["call_id"] for e in world.receiver().effects()] == ["c1", "c2", "w1"]
