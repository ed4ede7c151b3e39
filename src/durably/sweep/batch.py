"""Batching and chains: a labelled sweep's groups of scenarios, one world at a time.

A group is a first crash and, at depth 2, every second crash in the restart
that follows it; a batch is a few groups of one configuration, run one after
another in one world, their kills made by chains of forked processes
(:mod:`durably.sweep._chain`) where forking is safe.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, replace
from pathlib import Path

from .. import faults
from ..state import Phase, RunState
from . import _chain, _output
from .config import Config
from .engine import restart_and_judge
from .job import SweepJob
from .judge import ScenarioResult, ScenarioSpec, count_saved_turns, judge_scenario, paid_again
from .process import LABELS, Recorder, run_process, was_killed
from .tree import Tree, Uncopyable
from .world import RUN_ID, StoreFactory, World, scratch_root

__all__ = ["BATCH", "Group", "run_batch", "run_group"]

BATCH = 8
"""Groups (first crashes) a worker takes at a time: their first kills are one chain."""


@dataclass(frozen=True)
class Group:
    """A first crash and, at depth 2, every second crash in the restart that follows it."""

    config: Config
    first: int
    label: str
    covers: int
    depth: int
    merge: bool = True
    chain: bool = True
    """Kills at points of the same run (a batch's first crashes, a group's second ones)
    made by one chain of processes (:mod:`durably.sweep._chain`)."""


def run_group(
    job: SweepJob,
    group: Group,
    reference: Counter[str],
    store: StoreFactory | None,
) -> list[ScenarioResult]:
    """One group's scenarios: :func:`run_batch` of one."""
    (results,) = run_batch(job, [group], reference, store)
    return results


def run_batch(
    job: SweepJob,
    groups: Sequence[Group],
    reference: Counter[str],
    store: StoreFactory | None,
) -> list[list[ScenarioResult]]:
    """Groups of one configuration, in order of first crash, one after another in one world.

    Each group is its first crash's scenario, then each second crash's, all
    from one real first kill: the disk the killed process left is kept in
    memory and laid down again, at the same path, before each second crash's
    restart. A dead process writes nothing more, so that disk is the one a
    fresh world killed at the same point would leave, and re-running the first
    process for every second crash (most of a scenario's cost) proves nothing
    more. With ``chain`` (:mod:`durably.sweep._chain`), the batch's first kills
    are one chain of processes from a fresh world, and each group's second
    kills are made by its first restart as it finds them (:func:`_recording_chain`),
    instead of one process each.
    """
    with tempfile.TemporaryDirectory(prefix="durably-sweep-", dir=scratch_root()) as scratch:
        world = World(root=Path(scratch) / "world", config=groups[0].config, store_factory=store)

        def fresh() -> None:
            if world.root.exists():
                shutil.rmtree(world.root)
            world.root.mkdir()
            job.prepare(world)

        chained: dict[int, Tree] = {}
        if len(groups) > 1 and groups[0].chain:
            chained = _chained_kills(job, world, [g.first for g in groups], fresh, first=True)
        batch = []
        for group in groups:
            left = chained.get(group.first)
            error = None
            if left is None:
                fresh()
                error = _first_process(job, world, group.first)
            else:
                left.write(world.root)
            batch.append(_after_first_kill(job, world, group, left, reference, store, error))
        return batch


def _after_first_kill(  # noqa: PLR0917 - private, one caller in this module
    job: SweepJob,
    world: World,
    group: Group,
    left: Tree | None,
    reference: Counter[str],
    store: StoreFactory | None,
    error: str | None,
) -> list[ScenarioResult]:
    """A group's scenarios once its first process is dead: ``left`` is its disk, if copied."""
    first = ScenarioSpec(
        group.config, 1, group.first, None, (group.label,), group.covers, group.merge
    )
    if group.depth < 2:
        return [restart_and_judge(job, world, first, reference, error)]
    if left is None:
        with suppress(Uncopyable):  # if it is, each second crash starts from a fresh world
            left = Tree.read(world.root)
    # What every restart after this first crash sees when it begins (the paid-twice
    # count of a chained second kill starts here).
    saved_turns, asked = count_saved_turns(world), len(job.call_log(world).turns(RUN_ID))
    done: ScenarioResult | None = None
    killed: dict[int, Tree] = {}
    if left is not None and group.chain and _chain.chaining_possible():
        done, killed = _recording_chain(job, world, first, reference, error, saved_turns, asked)
        if done is None:
            left.write(world.root)
    if done is None:
        done = restart_and_judge(job, world, first, reference, error)
    results = [done]
    specs = [
        ScenarioSpec(group.config, 2, group.first, point, (group.label, label), covers, group.merge)
        for point, label, covers in zip(
            done.restart_points, done.restart_labels, done.restart_covers, strict=True
        )
    ]
    if left is None:
        return results + [_run_scenario(job, spec, reference, store) for spec in specs]
    disk = left
    if group.chain:
        seconds = [spec.second for spec in specs if spec.second is not None]
        missing = [second for second in seconds if second not in killed]
        killed |= _chained_kills(job, world, missing, lambda: disk.write(world.root), first=False)
    for spec in specs:
        if spec.second in killed:
            killed[spec.second].write(world.root)
            paid_twice = paid_again(job.call_log(world), asked, saved_turns)
            results.append(
                restart_and_judge(job, world, spec, reference, error, second_killed=paid_twice)
            )
        else:
            left.write(world.root)
            results.append(restart_and_judge(job, world, spec, reference, error))
    return results


def _recording_chain(  # noqa: PLR0917 - private, one caller in this module
    job: SweepJob,
    world: World,
    spec: ScenarioSpec,
    reference: Counter[str],
    error: str | None,
    saved_turns: int,
    asked: int,
) -> tuple[ScenarioResult | None, dict[int, Tree]]:
    """The first restart after a first crash, killed at each second crash it finds on its way.

    The restart that records a group's second crashes and the chain that then
    kills a process at each of them (:func:`_chained_kills`) would run the
    same recovery from the same disk twice. Here one chain does both: its
    process fingerprints each point as the recording restart does, and where
    the point is a new one inside the recovery window it forks its
    continuation and is killed there; past the window the last continuation
    runs on to the end as the uncrashed first restart, and is judged as it
    (``spec``, depth 1). ``saved_turns`` and ``asked`` are what the first
    crash's disk holds.

    Returns:
        That scenario's result, None if the chain ended at a kill (a point
        where a fork was unsafe): the caller restarts the run afresh; and the
        disk left at each kill.
    """
    start = not world.has_run()
    recorder = Recorder(job, world, window_only=True, merge=spec.merge)
    record_path = world.root / "restart.json"

    def run(plan: faults.CrashPlan, prepare: Callable[[], None]) -> None:
        _output.scenario_logging()
        run_process(job, world, start=start, plan=plan, prepare=prepare)
        record_path.write_text(json.dumps(recorder.record(plan)))

    try:
        chain = _chain.chain_to_end(world.root, lambda _point, label: recorder.at_point(label), run)
    except Uncopyable:
        return None, {}
    killed = {kill.point: kill.disk for kill in chain.kills}
    if chain.status is None:
        return None, killed
    paid_twice = paid_again(job.call_log(world), asked, saved_turns)
    record = json.loads(record_path.read_text()) if record_path.exists() else None
    final: RunState | None = None
    finished = False
    if chain.status != 0:
        error = error or f"restart 1 failed (status {chain.status})"
    else:
        final = world.read()
        finished = final.phase is Phase.DONE
    result = judge_scenario(
        job, world, spec, reference, finished, paid_twice, record, error, state=final
    )
    stray = sorted(set(killed) - set(result.restart_points))
    if stray:  # the chain and the record disagree: the sweep fails on this scenario's error
        disagree = f"the chain killed at points the record does not pick: {stray}"
        result = replace(result, error=result.error or disagree)
    return result, killed


def _chained_kills(
    job: SweepJob,
    world: World,
    points: Sequence[int],
    begin: Callable[[], None],
    *,
    first: bool,
) -> dict[int, Tree]:
    """The disk a process leaves when killed at each of ``points``, by chains of kills.

    ``begin`` lays down the disk each chain starts from (a fresh world, or a
    first crash's disk); ``first`` says the chain starts the run rather than
    resumes it. A chain cut short (a point where forking is unsafe) is followed
    by a new one for the points after it; a point no chain reached is left
    out, for the caller to run alone.
    """
    if not _chain.chaining_possible():
        return {}
    disks: dict[int, Tree] = {}
    remaining = list(points)
    while remaining:
        begin()
        start = first or not world.has_run()

        def run(plan: faults.CrashPlan, prepare: Callable[[], None], start: bool = start) -> None:
            _output.scenario_logging()
            run_process(job, world, start=start, plan=plan, prepare=prepare)

        try:
            kills = _chain.chain_kills(world.root, remaining, run)
        except Uncopyable:
            break  # the points left are run one process each, from a fresh start
        if not kills:
            break
        disks.update((kill.point, kill.disk) for kill in kills)
        remaining = [point for point in remaining if point > kills[-1].point]
    return disks


def _run_scenario(
    job: SweepJob, spec: ScenarioSpec, reference: Counter[str], store: StoreFactory | None
) -> ScenarioResult:
    """One scenario in a fresh world: the first process killed, then the restarts."""
    with tempfile.TemporaryDirectory(prefix="durably-sweep-", dir=scratch_root()) as scratch:
        world = World(root=Path(scratch), config=spec.config, store_factory=store)
        job.prepare(world)
        error = _first_process(job, world, spec.first)
        return restart_and_judge(job, world, spec, reference, error)


def _first_process(job: SweepJob, world: World, point: int) -> str | None:
    """Start the run in a process that SIGKILLs itself at ``point``; the error, if it did not."""
    status = LABELS.process(job, world, first=True, at=point, record=None)
    if not was_killed(status):
        return f"the first process did not die at point {point} (status {status})"
    return None
