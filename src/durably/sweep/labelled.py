"""The crash sweep: kill a job at every crash point, restart it, count what went wrong.

For each configuration the sweep

1. runs the job once in a child process, recording every crash point reached
   and a fingerprint of what a crash there would leave behind (the checkpoint,
   the receivers, the model's call log);
2. for each point (depth 1): a fresh world, a child process that SIGKILLs
   itself at that point, then restarts in new child processes until the run
   finishes, then judges the world;
3. at depth 2, for each first crash, crashes again at every point of the first
   restart up to its first saved model reply (the recovery: the resume save,
   the ladder, the interrupted reply's remaining calls);
4. reports per scenario: finished, duplicated effects, lost effects, questions
   asked of a person, saved replies paid for twice, failed checks, and which
   ladder step decided each in-doubt call.
   A scenario the harness could not run as planned carries an error, and a row
   with an errored scenario, or with none, fails the sweep.

Children are forked from warm worker processes (a fork server: no interpreter
start-up per scenario, and whatever the job builds lazily is built once, by a
warm-up run in each worker) and die by a real SIGKILL: no ``finally`` runs, no
lock is released politely. Points whose fingerprint equals the previous point's
leave an identical disk (temp files aside, which every open removes), so a crash
there is the same scenario; the sweep runs it once and counts the points it
covers (``merge=False``, ``durably sweep --no-merge``, kills at every point
instead). The second crashes that follow one first crash share its kill: the
disk the killed process left is kept in memory and laid down again, at the same
path, before each of their restarts.
"""

from __future__ import annotations

import functools
import json
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from .. import faults
from .batch import BATCH, Group, run_batch
from .config import CONFIGS, Config, check_knobs
from .job import SweepJob
from .judge import ScenarioResult, distinct
from .pool import Workers, check_jobs, scenario_workers
from .process import run_scenario_process
from .report import SweepReport, raise_on_problems
from .world import StoreFactory, World, scratch_root

__all__ = ["assert_clean", "run_sweep"]


def record_points(
    job: SweepJob, config: Config, store: StoreFactory | None
) -> tuple[list[str], list[str], Counter[str]]:
    """Run the job once without crashing: its crash points, fingerprints and effects."""
    with tempfile.TemporaryDirectory(prefix="durably-sweep-", dir=scratch_root()) as scratch:
        world = World(root=Path(scratch), config=config, store_factory=store)
        job.prepare(world)
        record = world.root / "points.json"
        status = run_scenario_process(
            job, world, first=True, plan=faults.CrashPlan(), record=record
        )
        if status != 0 or not record.exists():
            raise RuntimeError(f"{job.name} under {config.name!r} did not finish without crashes")
        data = json.loads(record.read_text())
        return data["labels"], data["prints"], job.effects(world)


def run_sweep(  # noqa: PLR0913 - the sweep's public options, keyword-only with defaults
    job: SweepJob,
    *,
    configs: Sequence[Config] = CONFIGS,
    depth: int = 1,
    jobs: int = 1,
    progress: Callable[[int, int], None] | None = None,
    store: StoreFactory | None = None,
    workers: Workers = "fork",
    merge: bool = True,
    chain: bool = True,
    on_results: Callable[[Sequence[ScenarioResult]], None] | None = None,
) -> SweepReport:
    """Sweep ``job`` over ``configs`` at depth 1 (and 2); see the module docstring.

    Args:
        job: what to sweep.
        configs: the configurations, each swept separately.
        depth: 1, or 2 for a second crash during the first restart's recovery.
        jobs: worker processes running scenarios in parallel.
        progress: called with (first crashes done, first crashes in all): once
            before the first scenario, then as each batch is judged. The total
            never changes: a first crash is done with all its second crashes,
            which are found only as its restart runs (so scenarios cannot be
            counted ahead; ``on_results`` counts them as they come).
        store: builds each scenario's store over its directory (default: the
            job's ``world.store()`` default, an unsynced ``FileStore``); e.g.
            ``functools.partial(JournalStore, sync=False)``.
        workers: ``"fork"`` (default): workers are forked from this process, so
            the job sees everything the caller set up (a monkeypatch, a fake
            service in memory). ``"fresh"``: workers are new interpreters that
            get the job, configurations and store factory pickled (importable
            classes, not ones defined in a function or in ``__main__``); a
            caller holding much memory, like a test session, sweeps much faster
            so (see :mod:`durably.sweep._fresh`).
        merge: run one scenario per run of points with equal fingerprints (the
            default); False kills at every labelled point, first and second,
            trusting no equivalence (several times slower).
        chain: kill one chain of forked processes at a batch's first crashes,
            and have each group's first restart die at its second crashes as
            it reaches them (the default); False starts a process for each kill
            (slower, judged alike).
        on_results: called with each batch's scenarios as they are judged (to
            count them, or to keep what ran should the sweep be interrupted).
    """
    if depth not in (1, 2):
        raise ValueError("depth is 1 or 2")
    check_jobs(jobs)
    check_knobs(job, configs)
    if workers == "fresh":
        from ._fresh import check_picklable

        check_picklable(job, configs, store)
    elif workers != "fork":
        raise ValueError(f"workers is 'fork' or 'fresh', got {workers!r}")
    if not configs:
        raise ValueError("give at least one configuration to sweep")
    references: dict[str, Counter[str]] = {}
    groups: list[Group] = []
    for config in configs:
        labels, prints, effects = record_points(job, config, store)
        references[config.name] = effects
        # Baselines already fail at depth 1; a second crash adds nothing to that proof.
        group_depth = depth if config.protected else 1
        for index, covers in distinct(prints, merge):
            groups.append(
                Group(config, index, labels[index - 1], covers, group_depth, merge, chain)
            )
    results: list[ScenarioResult] = []
    firsts = 0
    if progress is not None:
        progress(firsts, len(groups))
    batches: list[list[Group]] = []
    for config in configs:
        mine = [group for group in groups if group.config is config]
        batches += [mine[at : at + BATCH] for at in range(0, len(mine), BATCH)]
    run = functools.partial(_run_batch_of, job, references, store)
    with scenario_workers(jobs, job, configs[0], run, store, workers) as run_all:
        for done in run_all(batches):
            found = [result for _, group_results in done for result in group_results]
            results.extend(found)
            firsts += len(done)
            if on_results is not None:
                on_results(found)
            if progress is not None:
                progress(firsts, len(groups))
    order = {c.name: i for i, c in enumerate(configs)}
    results.sort(key=lambda r: (order[r.config], r.depth, r.at))
    return SweepReport(
        job=job.name,
        results=tuple(results),
        configs=tuple(configs),
        depth=depth,
    )


def _run_batch_of(
    job: SweepJob,
    references: dict[str, Counter[str]],
    store: StoreFactory | None,
    batch: Sequence[Group],
) -> list[tuple[int, list[ScenarioResult]]]:
    """A worker's task in :func:`run_sweep`: a batch of groups, each with its depth."""
    found = run_batch(job, batch, references[batch[0].config.name], store)
    return [(group.depth, results) for group, results in zip(batch, found, strict=True)]


def assert_clean(
    job: SweepJob,
    *,
    configs: Sequence[Config] = CONFIGS[:1],
    depth: int = 1,
    jobs: int = 1,
    store: StoreFactory | None = None,
    workers: Workers = "fork",
) -> SweepReport:
    """Sweep ``job`` and fail (``AssertionError`` with the table) on any problem.

    The pytest helper: a user sweeps their own agent in their own suite with
    ``durably.sweep.assert_clean(MyJob(), depth=2)``; the arguments are
    :func:`run_sweep`'s.
    """
    report = run_sweep(job, configs=configs, depth=depth, jobs=jobs, store=store, workers=workers)
    return raise_on_problems(report)
