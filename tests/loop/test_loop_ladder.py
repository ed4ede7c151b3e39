"""The resolution ladder (SPEC section 6): each crash moment against each kind of tool."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import pytest
from _loop_world import (
    ANSWER,
    KEY_TTL,
    PERSON_SAYS,
    Job,
    Toolset,
    World,
    answer,
    reply,
    resume,
    start,
    tool_results,
)

import durably
from durably import Phase
from durably.faults import CrashPlan


@dataclass(frozen=True)
class Variant:
    """One kind of tool the ladder must handle, as the single call of a job."""

    tool: str
    arguments: str
    toolset: Toolset
    expire_key: bool = False
    """Move the clock past the key's TTL between the crash and the resume."""


VARIANTS = {
    "keyed-live": Variant("keyed", '{"order": "A1", "cents": 500}', Toolset()),
    "keyed-expired": Variant("keyed", '{"order": "A1", "cents": 500}', Toolset(), expire_key=True),
    "write-lookup": Variant("write", '{"note": "A1"}', Toolset(write_lookup="certain")),
    "write-lookup-unknown": Variant("write", '{"note": "A1"}', Toolset(write_lookup="unknown")),
    "write-lookup-raises": Variant("write", '{"note": "A1"}', Toolset(write_lookup="raises")),
    "write-no-lookup": Variant("write", '{"note": "A1"}', Toolset(write_lookup="none")),
}

# Where the first process dies. The saves of a one-call run: 1 start, 2 model call, 3 reply,
# 4 attempt, 5 result.
MOMENTS: dict[str, Callable[[str], CrashPlan]] = {
    "a-marker-not-durable": lambda tool: CrashPlan(label="store.save.temp_written", occurrence=4),
    "b-marker-saved": lambda tool: CrashPlan(label="loop.saved.attempt"),
    "c-acted-unsaved": lambda tool: CrashPlan(label=f"loop.tool_returned:{tool}"),
    "d-result-saved": lambda tool: CrashPlan(label="loop.saved.result"),
}


@dataclass(frozen=True)
class Cell:
    """What the world shows once the resumed run is done."""

    requests: int
    """Requests that reached the receiver (a deduplicated repeat counts; it changes nothing)."""
    questions: int
    """Questions the person was asked."""
    decided_by: tuple[int, str] | None
    """The ladder step and outcome saved for the call; None when it was never in doubt."""


UNTOUCHED = Cell(requests=1, questions=0, decided_by=None)
PERSON_RERUN = Cell(requests=1, questions=1, decided_by=(3, "rerun"))
PERSON_DONE = Cell(requests=1, questions=1, decided_by=(3, "done"))

#: variant -> moment -> cell; every cell has exactly one effect at the receiver.
LADDER: dict[str, dict[str, Cell]] = {
    "keyed-live": {
        "a-marker-not-durable": UNTOUCHED,
        "b-marker-saved": Cell(requests=1, questions=0, decided_by=(1, "rerun")),
        "c-acted-unsaved": Cell(requests=2, questions=0, decided_by=(1, "rerun")),
        "d-result-saved": UNTOUCHED,
    },
    "keyed-expired": {
        "a-marker-not-durable": UNTOUCHED,
        "b-marker-saved": PERSON_RERUN,
        "c-acted-unsaved": PERSON_DONE,
        "d-result-saved": UNTOUCHED,
    },
    "write-lookup": {
        "a-marker-not-durable": UNTOUCHED,
        "b-marker-saved": Cell(requests=1, questions=0, decided_by=(2, "not-found")),
        "c-acted-unsaved": Cell(requests=1, questions=0, decided_by=(2, "found")),
        "d-result-saved": UNTOUCHED,
    },
    **{
        variant: {
            "a-marker-not-durable": UNTOUCHED,
            "b-marker-saved": PERSON_RERUN,
            "c-acted-unsaved": PERSON_DONE,
            "d-result-saved": UNTOUCHED,
        }
        for variant in ("write-lookup-unknown", "write-lookup-raises", "write-no-lookup")
    },
}

CASES = [
    pytest.param(variant, moment, cell, id=f"{variant}-{moment[0]}")
    for variant, row in LADDER.items()
    for moment, cell in row.items()
]


def check_crash_moment(world: World, moment: str, tool: str) -> None:
    """The first process died where the moment says: assert what the disk and receiver show."""
    state = world.state()
    effects = len(world.receiver().effects(tool))
    results = tool_results(state)
    if moment == "a-marker-not-durable":
        assert (state.phase, state.markers, effects, results) == (Phase.TOOLS, {}, 0, [])
    elif moment == "b-marker-saved":
        assert (list(state.markers), effects, results) == (["c1"], 0, [])
    elif moment == "c-acted-unsaved":
        assert (list(state.markers), effects, results) == (["c1"], 1, [])
    else:
        assert (state.markers, effects, [r[0] for r in results]) == ({}, 1, ["c1"])


@pytest.mark.parametrize(("variant_name", "moment", "cell"), CASES)
def test_the_ladder_settles_each_in_doubt_call_at_the_lowest_step_that_can_decide(
    world: World, variant_name: str, moment: str, cell: Cell
) -> None:
    """An in-doubt call reruns if harmless, else its lookup decides, else a person; never twice."""
    variant = VARIANTS[variant_name]
    # The person answers truthfully: the call acted exactly when the process died after it returned.
    truth = durably.Done(PERSON_SAYS) if moment == "c-acted-unsaved" else durably.Rerun()
    job = Job(
        replies=(reply(("c1", variant.tool, variant.arguments)), answer()),
        toolset=variant.toolset,
        resolve=(truth,) if cell.questions else (),
    )

    crashed = start(world, job, plan=MOMENTS[moment](variant.tool))
    assert crashed.killed
    check_crash_moment(world, moment, variant.tool)
    if variant.expire_key:
        world.advance(KEY_TTL + timedelta(minutes=1))
    resumed = resume(world, job)

    assert resumed.finished()["answer"] == ANSWER
    receiver = world.receiver()
    state = world.state()
    assert len(receiver.effects(variant.tool)) == 1
    assert len(receiver.requests("c1")) == cell.requests
    assert len(world.questions("resolve")) == cell.questions
    assert world.questions("approve") == []
    decided = state.resolutions.get("c1")
    assert (None if decided is None else (decided.step, decided.outcome)) == cell.decided_by
    # What the model sees: the person's account when they said done, else the receiver's reply.
    told = PERSON_SAYS if cell.decided_by == (3, "done") else receiver.effects()[0]["result"]
    assert tool_results(state) == [("c1", told, False)]
    assert (state.markers, state.pending) == ({}, {})
