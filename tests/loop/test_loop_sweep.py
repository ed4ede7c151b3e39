"""The sweep: SIGKILL a run at every crash point, resume it in a new process, judge the world."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from _loop_world import (
    ANSWER,
    Job,
    Toolset,
    World,
    answer,
    carry_on,
    record,
    reply,
    script,
    start,
    tool_results,
)

import durably
from durably import Effect, Phase, RunState
from durably.faults import CrashPlan
from durably.workspace import sha256_bytes

SWEEP = Job(
    replies=(
        reply(
            ("c1", "read", '{"item": "widgets"}'),
            ("c2", "keyed", '{"order": "A1", "cents": 500}'),
            text="checking stock before refunding",
        ),
        reply(
            ("c3", "idempotent", '{"path": "notes/a1.txt", "text": "A1 refunded"}'),
            ("c4", "write", '{"note": "A1 refunded"}'),
            ("c5", "keyed", '{"order": "B2", "cents": 700}'),
        ),
        reply(
            ("c6", "write", '{"note": "B2 refunded"}'),
            ("c7", "read", '{"item": "gadgets"}'),
        ),
        answer(),
    ),
    toolset=Toolset(write_needs_approval=True),
)
EFFECTS = {"read": Effect.READ, "idempotent": Effect.IDEMPOTENT, "keyed": Effect.KEYED}


@dataclass(frozen=True)
class Timeline:
    """The crash points of the uncrashed run, counted from 1, and where each save landed."""

    labels: list[str]

    def at(self, label: str) -> list[int]:
        """The points (numbered from 1) where ``label`` was passed."""
        return [i for i, seen in enumerate(self.labels, start=1) if seen == label]

    def landed(self, saved: int) -> int:
        """The point after which the save announced at ``saved`` is on disk (its rename)."""
        return max(i for i in self.at("store.save.renamed") if i < saved)


@dataclass(frozen=True)
class Expected:
    """What the world must show after a crash at one point and a resume."""

    restarted: bool
    """No state was saved before the crash: the job starts a new run."""
    finished: bool
    """The answer was saved before the crash: the resume only reads it (and counts no restart)."""
    turns: Counter[int]
    """Times each turn was requested from the model."""
    runs: dict[str, int]
    """Requests each call sent to the receiver."""
    resolutions: dict[str, tuple[int, str]]
    """Ladder step and outcome of each call left in doubt."""
    approvals: Counter[str]
    """Times the approver was asked about each call."""
    paused: bool = False
    """The last save before the crash was a pause: the resume is not a restart."""


def expect(timeline: Timeline, crash: int) -> Expected:
    """Derive the expected world from where the crash fell among the uncrashed run's saves."""
    calls = script(SWEEP.replies)
    returned = [i for i, label in enumerate(timeline.labels, 1) if label.startswith("loop.tool_")]
    assert [timeline.labels[i - 1] for i in returned] == [
        f"loop.tool_returned:{c.name}" for c in calls
    ]
    results = dict(zip((c.id for c in calls), timeline.at("loop.saved.result"), strict=True))
    acting = [c.id for c in calls if c.name != "read"]
    attempts = dict(zip(acting, timeline.at("loop.saved.attempt"), strict=True))
    asking = [c.id for c in calls if c.name == "write"]
    pauses = dict(zip(asking, timeline.at("loop.saved.pause"), strict=True))
    received = timeline.at("loop.reply_received")
    saved = timeline.at("loop.saved.reply")

    turns: Counter[int] = Counter()
    for turn, (got, kept) in enumerate(zip(received, saved, strict=True), start=1):
        # A reply that arrived but was not saved yet is asked for again.
        turns[turn] = 2 if got <= crash < timeline.landed(kept) else 1

    runs, resolutions, approvals = {}, {}, Counter[str]()
    for call, ran in zip(calls, returned, strict=True):
        acted = crash >= ran
        result_kept = crash >= timeline.landed(results[call.id])
        marker_kept = call.id in attempts and crash >= timeline.landed(attempts[call.id])
        in_doubt = marker_kept and not result_kept
        if call.name == "write":
            runs[call.id] = 1  # the lookup tells whether it happened: never twice
        else:
            runs[call.id] = 2 if acted and not result_kept else 1
        if in_doubt and call.name == "write":
            resolutions[call.id] = (2, "found" if acted else "not-found")
        elif in_doubt:
            resolutions[call.id] = (1, "rerun")
        if call.id in pauses:
            asked_unsaved = pauses[call.id] < crash < timeline.landed(attempts[call.id])
            approvals[call.id] = 2 if asked_unsaved else 1
    restarted = crash < timeline.landed(timeline.at("loop.saved.start")[0])
    finished = crash >= timeline.landed(saved[-1])
    labels_kept = [
        label
        for i, label in enumerate(timeline.labels, 1)
        if label.startswith("loop.saved.") and crash >= timeline.landed(i)
    ]
    paused = bool(labels_kept) and labels_kept[-1] == "loop.saved.pause"
    return Expected(restarted, finished, turns, runs, resolutions, approvals, paused)


def judge(world: World, expected: Expected, reference: RunState) -> list[str]:
    """Everything wrong with the world after the resume; empty when the run is sound."""
    problems: list[str] = []

    def check(what: str, found: object, wanted: object) -> None:
        if found != wanted:
            problems.append(f"{what}: {found!r}, expected {wanted!r}")

    state = world.state()
    check("phase", state.phase, Phase.DONE)
    check("answer", state.answer, ANSWER)
    check("tool results", tool_results(state), tool_results(reference))
    check("open markers", state.markers, {})
    check("pending questions", state.pending, {})
    check(
        "usage", (state.turns, state.usage, state.dollars), (4, reference.usage, reference.dollars)
    )
    not_restarts = expected.restarted or expected.finished or expected.paused
    check("resumes", state.resumes, 0 if not_restarts else 1)
    check("model requests per turn", Counter(world.model_turns()), expected.turns)

    receiver = world.receiver()
    calls = script(SWEEP.replies)
    check(
        "receiver requests per call",
        {c.id: len(receiver.requests(c.id)) for c in calls},
        expected.runs,
    )
    check(
        "keyed effects",
        [(e["call_id"], e["key"]) for e in receiver.effects("keyed")],
        [(c.id, durably.idempotency_key(state.run_id, c.id)) for c in calls if c.name == "keyed"],
    )
    check(
        "write effects",
        [e["call_id"] for e in receiver.effects("write")],
        [c.id for c in calls if c.name == "write"],
    )
    check(
        "workspace file",
        world.workspace().current_sha256("notes/a1.txt"),
        sha256_bytes("A1 refunded"),
    )
    check("workspace record", state.workspace, reference.workspace)
    check(
        "resolutions",
        {call_id: (r.step, r.outcome) for call_id, r in state.resolutions.items()},
        expected.resolutions,
    )
    check("approval questions", Counter(world.questions("approve")), expected.approvals)
    check("resolve questions", world.questions("resolve"), [])
    return problems


def test_a_sigkill_at_any_crash_point_loses_nothing_and_repeats_nothing(
    make_world: Callable[[str], World],
) -> None:
    """A run SIGKILLed at any crash point resumes to its answer, no reply paid twice, acts once."""
    recording = make_world("recording")
    labels, recorded = record(recording, SWEEP)
    reference = recording.state()
    assert recorded.finished()["outcome"]["answer"] == ANSWER
    timeline = Timeline(labels)
    assert len(labels) > 90  # every save and every reply and tool return of a 4-turn, 7-call run

    problems: list[str] = []
    for crash, label in enumerate(labels, start=1):
        world = make_world(f"crash-{crash:03d}")
        crashed = start(world, SWEEP, plan=CrashPlan(at=crash))
        resumed = carry_on(world, SWEEP)
        where = f"crash {crash} at {label}"
        if not crashed.killed:
            problems.append(f"{where}: the first process ended with {crashed.returncode}")
            continue
        if resumed.returncode != 0:
            problems.append(f"{where}: the resume failed: {resumed.error}: {resumed.message}")
            continue
        problems += [f"{where}: {p}" for p in judge(world, expect(timeline, crash), reference)]
    assert problems == []
