"""The judge: what a scenario left, against an uncrashed run's effects.

One rule for every sweep: :func:`duplicates_and_lost` counts the effects done
more often than in the uncrashed run, and those done less often.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..models import CallLog
from ..state import RunState
from .config import Config
from .job import SweepJob
from .process import WINDOW_END
from .world import RUN_ID, World

__all__ = [
    "ScenarioResult",
    "ScenarioSpec",
    "count_saved_turns",
    "distinct",
    "duplicates_and_lost",
    "judge_checks",
    "judge_scenario",
    "paid_again",
    "recovery_window",
]


@dataclass(frozen=True, kw_only=True)
class ScenarioResult:
    """What one scenario left behind."""

    config: str
    depth: int
    at: tuple[int, ...]
    """The crash points the scenario died at (1-based indices: first process, first restart)."""
    crashes: tuple[str, ...]
    """The labels of those crash points, in order."""
    covers: int
    """How many crash points this scenario stands for (equal fingerprints)."""
    finished: bool
    duplicates: int
    lost: int
    questions: int
    paid_twice: int
    failed_checks: tuple[str, ...]
    ladder_steps: dict[str, int] = field(default_factory=dict)
    restart_points: tuple[int, ...] = ()
    """Distinct crash points of the first restart (depth-2 candidates), as indices."""
    restart_labels: tuple[str, ...] = ()
    restart_covers: tuple[int, ...] = ()
    error: str | None = None


def distinct(prints: Sequence[str], merge: bool = True) -> list[tuple[int, int]]:
    """(1-based point index, points covered) for each run of equal fingerprints.

    Without ``merge``, every point stands for itself.
    """
    if not merge:
        return [(index, 1) for index in range(1, len(prints) + 1)]
    chosen: list[tuple[int, int]] = []
    previous = None
    for index, digest in enumerate(prints, 1):
        if digest != previous:
            chosen.append((index, 1))
        else:
            at, covers = chosen[-1]
            chosen[-1] = (at, covers + 1)
        previous = digest
    return chosen


def recovery_window(labels: Sequence[str]) -> int:
    """How many points of a restart belong to its recovery (up to its first saved reply)."""
    for index, label in enumerate(labels, 1):
        if label == WINDOW_END:
            return index
    return len(labels)


@dataclass(frozen=True)
class ScenarioSpec:
    """One scenario: its configuration, depth, first and second crash points, and labels."""

    config: Config
    depth: int
    first: int
    second: int | None
    labels: tuple[str, ...]
    covers: int
    merge: bool = True


def paid_again(log: CallLog, asked: int, saved_turns: int) -> int:
    """Replies asked for since the log held ``asked`` whose turn was already saved."""
    return sum(1 for turn in log.turns(RUN_ID)[asked:] if turn <= saved_turns)


def count_saved_turns(world: World) -> int:
    """The turns the world's saved run holds (0 when nothing is saved yet)."""
    try:
        return world.read().turns
    except Exception:  # noqa: BLE001 - not created yet: nothing saved
        return 0


def duplicates_and_lost(reference: Counter[str], effects: Counter[str]) -> tuple[int, int]:
    """The one rule every sweep judges effects by: (duplicated, lost) against ``reference``.

    ``reference`` is what the receivers performed in an uncrashed run. An effect
    performed more often is duplicated by the difference, one performed less
    often (or never) is lost by it.
    """
    duplicates = sum(max(0, n - reference[e]) for e, n in effects.items())
    lost = sum(max(0, n - effects[e]) for e, n in reference.items())
    return duplicates, lost


def judge_checks(
    checks: Sequence[tuple[str, bool, str]],
) -> tuple[int, int, tuple[str, ...]]:
    """A command's own checks, ``(name, ok, reason)`` each: (passed, total, failed lines)."""
    passed = sum(1 for _, ok, _ in checks if ok)
    failed = tuple(f"{name}: {reason}" for name, ok, reason in checks if not ok)
    return passed, len(checks), failed


def judge_scenario(  # noqa: PLR0913, PLR0917 - the judge takes everything a scenario left; one call site per sweep kind
    job: SweepJob,
    world: World,
    spec: ScenarioSpec,
    reference: Counter[str],
    finished: bool,
    paid_twice: int,
    restart_record: dict[str, Any] | None,
    error: str | None,
    *,
    state: RunState | None = None,
) -> ScenarioResult:
    """Judge the world a scenario left; ``state``, if given, is its saved state, read already."""
    duplicates, lost = duplicates_and_lost(reference, job.effects(world))
    questions = 0
    if world.questions_log.exists():
        questions = len(world.questions_log.read_text().splitlines())
    failed: list[str] = []
    steps: Counter[str] = Counter()
    try:
        state = state if state is not None else world.read()
        failed = job.checks(world, state) if finished else ["run did not finish"]
        steps = Counter(f"step {r.step} {r.outcome}" for r in state.resolutions.values())
    except Exception as exc:  # noqa: BLE001 - an unreadable checkpoint is the finding
        failed = [f"checkpoint unreadable: {exc}"]
    points: tuple[int, ...] = ()
    labels: tuple[str, ...] = ()
    covers: tuple[int, ...] = ()
    if restart_record is not None:
        window = recovery_window(restart_record["labels"])
        chosen = [(i, c) for i, c in distinct(restart_record["prints"], spec.merge) if i <= window]
        points = tuple(i for i, _ in chosen)
        covers = tuple(c for _, c in chosen)
        labels = tuple(restart_record["labels"][i - 1] for i in points)
    return ScenarioResult(
        config=spec.config.name,
        depth=spec.depth,
        at=(spec.first,) if spec.second is None else (spec.first, spec.second),
        crashes=spec.labels,
        covers=spec.covers,
        finished=finished,
        duplicates=duplicates,
        lost=lost,
        questions=questions,
        paid_twice=paid_twice,
        failed_checks=tuple(failed),
        ladder_steps=dict(steps),
        restart_points=points,
        restart_labels=labels,
        restart_covers=covers,
        error=error,
    )
