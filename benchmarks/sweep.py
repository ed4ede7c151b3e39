"""How fast the default crash sweep runs: wall time, scenarios per second, cost per scenario.

    .venv/bin/python benchmarks/sweep.py [--depth 1|2] [--jobs N] [--repeat N]
    .venv/bin/python benchmarks/sweep.py --ballast 300 --workers both --config "keys honoured"

Runs the reference triage job's default sweep (every configuration; depth 2 for
the protected ones) ``--repeat`` times and prints the table once, the scenario
counts, and the median wall time and rate.

The baseline, measured in the same run on the same machine, around each sweep:
one uncrashed run of the job in a process forked from a warm one (the job has
run once in it and its objects are frozen for the collector, as in a sweep's
worker), from a fresh world in the sweep's scratch directory to its judged end;
the mean of the median of half of ``--baseline-runs`` just before the sweep and
of the other half just after it (the machine's speed drifts). The
sweep's cost per scenario is reported as a multiple of it (wall time x workers
/ scenarios / baseline): how many plain runs one crash scenario costs, whatever
the machine's speed. The same ratio is also given in CPU time (every process's
user and system time), which other work on the machine disturbs less than wall
time (a loaded machine slows the baseline's single process more than a sweep's
workers, and the wall ratio then flatters the sweep). The target (issue 19): at
most 1.0 plain run per scenario, the median of the repeats' ratios, in wall and
in CPU time both. Absolute times depend on the machine and its load; compare
runs made on the same one.

``--ballast MB`` makes the caller hold that much memory in small Python objects
first, as a test session does; ``--workers both`` then sweeps with forked and
with fresh workers in turn (interleaved, so a slow moment of the machine hits
both) and prints each median and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from durably.sweep import (
    CONFIGS,
    RUN_ID,
    StoreFactory,
    SweepApprover,
    SweepJob,
    Workers,
    World,
    run_in_child,
    run_sweep,
    scratch_root,
)
from durably.triage.job import TriageJob

TARGET = 1.0
"""Plain runs per scenario, at most (issue 19)."""


def _cpu() -> float:
    """CPU seconds of this process and every child it has waited for.

    From ``getrusage``, whose user + system time is the kernel's exact run time
    (``os.times`` counts whole 10 ms ticks, too coarse for a 30 ms run).
    """
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def warm(job: SweepJob, *, store: StoreFactory | None = None) -> None:
    """Run the job once in this process, as a sweep's worker does before it forks.

    Then, as the worker does, collect and freeze the garbage collector's
    objects, so a plain run's child copies no more pages than a scenario's.
    """
    with tempfile.TemporaryDirectory(prefix="durably-bench-", dir=scratch_root()) as scratch:
        world = World(root=Path(scratch), config=CONFIGS[0], store_factory=store)
        job.prepare(world)
        agent = job.agent(world, SweepApprover(job, world))
        asyncio.run(agent.run(job.task(), run_id=RUN_ID))
    gc.collect()
    gc.freeze()


def plain_run(
    job: SweepJob, *, store: StoreFactory | None = None, scratch_dir: str | None = None
) -> tuple[float, float]:
    """One uncrashed run in a forked process, from a fresh world to its checks.

    Returns:
        (wall seconds, CPU seconds of this process and the child).
    """
    started, cpu = time.perf_counter(), _cpu()
    scratch_dir = scratch_dir if scratch_dir is not None else scratch_root()
    with tempfile.TemporaryDirectory(prefix="durably-bench-", dir=scratch_dir) as scratch:
        world = World(root=Path(scratch), config=CONFIGS[0], store_factory=store)
        job.prepare(world)

        def body() -> None:
            agent = job.agent(world, SweepApprover(job, world))
            asyncio.run(agent.run(job.task(), run_id=RUN_ID))

        if run_in_child(body) != 0:
            raise RuntimeError("the plain run failed")
        failed = job.checks(world, world.read())
        if failed:
            raise RuntimeError(f"the plain run failed its checks: {failed}")
    return time.perf_counter() - started, _cpu() - cpu


def baseline(runs: int, measure: Callable[[], tuple[float, float]]) -> tuple[float, float]:
    """Median wall and CPU seconds of ``runs`` plain runs."""
    found = [measure() for _ in range(runs)]
    return statistics.median(w for w, _ in found), statistics.median(c for _, c in found)


def bracketing(before: tuple[float, float], after: tuple[float, float]) -> tuple[float, float]:
    """The baseline of a sweep: the mean of the medians measured just before and just after it.

    This machine's speed drifts by a tenth or more within a minute (other
    guests): a baseline measured on one side of a 40-second sweep alone moved
    the ratio by as much.
    """
    return (before[0] + after[0]) / 2, (before[1] + after[1]) / 2


def main() -> None:  # noqa: PLR0915 - the benchmark's main: arguments, runs, table, in order
    """Run the benchmark, print the ratio and whether the target is met."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--depth", type=int, choices=(1, 2), default=2)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--task", default="m1-done-after-delete")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline-runs", type=int, default=30)
    parser.add_argument("--config", action="append", help="only these configurations")
    parser.add_argument("--workers", choices=("fork", "fresh", "both"), default="fork")
    parser.add_argument("--ballast", type=int, default=0, help="MB the caller holds first")
    parser.add_argument(
        "--chain",
        choices=("on", "off", "both"),
        default="on",
        help="kills chained (on: the default sweep), a process for every kill (off), or both "
        "in turn",
    )
    args = parser.parse_args()
    job = TriageJob(args.task)
    configs = [c for c in CONFIGS if c.name in args.config] if args.config else list(CONFIGS)
    ballast = [{"n": i, "text": str(i) * 20} for i in range(args.ballast * 4000)]
    if ballast:
        rss = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGESIZE")
        print(f"ballast: {len(ballast)} objects, caller's resident memory {rss >> 20} MB")
    warm(job)
    print(f"scenario worlds and plain runs in {scratch_root() or tempfile.gettempdir()}")
    workers: list[Workers] = ["fork", "fresh"] if args.workers == "both" else [args.workers]
    chains = {"on": [True], "off": [False], "both": [False, True]}[args.chain]
    kinds = [(kind, chain) for kind in workers for chain in chains]
    times: dict[tuple[Workers, bool], list[float]] = {kind: [] for kind in kinds}
    cpu_times: dict[tuple[Workers, bool], list[float]] = {kind: [] for kind in kinds}
    wall_ratios: list[float] = []
    cpu_ratios: list[float] = []
    plain_walls: list[float] = []
    plain_cpus: list[float] = []
    report = None
    for attempt in range(1, args.repeat + 1):
        half = max(1, args.baseline_runs // 2)
        before = baseline(half, lambda: plain_run(job))
        found: list[tuple[tuple[Workers, bool], float, float, int]] = []
        for kind in kinds:
            started, cpu = time.perf_counter(), _cpu()
            report = run_sweep(
                job,
                configs=configs,
                depth=args.depth,
                jobs=args.jobs,
                workers=kind[0],
                chain=kind[1],
            )
            wall, cpu = time.perf_counter() - started, _cpu() - cpu
            problems = report.problems()
            if problems:
                # A sweep whose kills did not happen, or whose scenarios errored, is fast
                # for the wrong reason: no figure of it counts.
                print(report.text())
                raise SystemExit("the sweep had problems:\n" + "\n".join(problems))
            times[kind].append(wall)
            cpu_times[kind].append(cpu)
            found.append((kind, wall, cpu, len(report.results)))
        after = baseline(half, lambda: plain_run(job))
        plain_wall, plain_cpu = bracketing(before, after)
        plain_walls.append(plain_wall)
        plain_cpus.append(plain_cpu)
        for kind, wall, cpu, scenarios in found:
            if kind == kinds[-1]:
                wall_ratios.append(wall * args.jobs / scenarios / plain_wall)
                cpu_ratios.append(cpu / scenarios / plain_cpu)
            print(
                f"run {attempt} ({_name(kind)}): {wall:.1f} s, CPU {cpu:.1f} s "
                f"(load {os.getloadavg()[0]:.1f}); plain run {plain_wall * 1000:.1f} ms "
                f"(before {before[0] * 1000:.1f}, after {after[0] * 1000:.1f}), "
                f"CPU {plain_cpu * 1000:.1f} ms",
                flush=True,
            )
    assert report is not None
    walls = times[kinds[-1]]
    print(report.text())
    scenarios = len(report.results)
    points = sum(r.covers for r in report.results)
    wall = statistics.median(walls)
    print(f"{scenarios} scenarios covering {points} crash points, {args.jobs} worker(s)")
    print(f"median wall time {wall:.1f} s over {len(walls)} run(s)", end=", ")
    print(f"{scenarios / wall:.1f} scenarios/s")
    print(
        f"baseline: one plain run in a process forked from a warm one, median "
        f"{statistics.median(plain_walls) * 1000:.1f} ms wall, "
        f"{statistics.median(plain_cpus) * 1000:.1f} ms CPU"
    )
    per_scenario = wall * args.jobs / scenarios
    wall_ratio, cpu_ratio = statistics.median(wall_ratios), statistics.median(cpu_ratios)
    print(f"cost per scenario {per_scenario * 1000:.1f} ms of a worker")
    print(
        "each repeat's plain runs per scenario: wall "
        + ", ".join(f"{r:.3f}" for r in wall_ratios)
        + "; CPU "
        + ", ".join(f"{r:.3f}" for r in cpu_ratios)
    )
    print(
        f"plain runs per scenario (median of {len(wall_ratios)}): wall {wall_ratio:.2f}, "
        f"CPU {cpu_ratio:.2f}; target <= {TARGET} (both): "
        f"{'met' if max(wall_ratio, cpu_ratio) <= TARGET else 'NOT met'}"
    )
    if len(workers) == 2:
        fork, fresh = (statistics.median(times[(w, chains[-1])]) for w in workers)
        print(f"forked workers: median {fork:.1f} s; fresh workers: median {fresh:.1f} s")
        print(f"fresh / forked = {fresh / fork:.2f}")
    if len(chains) == 2:
        for worker in workers:
            off, on = ((worker, chain) for chain in chains)
            print(
                f"{worker} workers, chained / unchained (medians): wall "
                f"{statistics.median(times[on]) / statistics.median(times[off]):.2f}, CPU "
                f"{statistics.median(cpu_times[on]) / statistics.median(cpu_times[off]):.2f}"
            )


def _name(kind: tuple[Workers, bool]) -> str:
    return f"{kind[0]}{'' if kind[1] else ', unchained'}"


if __name__ == "__main__":
    main()
