"""How fast the default crash sweep runs: wall time, scenarios per second, cost per scenario.

    .venv/bin/python benchmarks/sweep.py [--depth 1|2] [--jobs N] [--repeat N]
    .venv/bin/python benchmarks/sweep.py --ballast 300 --workers both --config "keys honoured"

Runs the reference triage job's default sweep (every configuration; depth 2 for
the protected ones) ``--repeat`` times and prints the table once, the scenario
counts, and the median wall time and rate. The target (issue 5) is the whole
default sweep in under 60 seconds on the 2-core development machine.

The baseline, measured in the same run on the same machine: one uncrashed run
of the job in a freshly forked process, from a fresh world to its judged end
(median of ``--baseline-runs``). The sweep's cost per scenario is reported as a
multiple of it (wall time x workers / scenarios / baseline): how many plain
runs one crash scenario costs, whatever the machine's speed. Absolute times
depend on the machine and its load; compare runs made on the same one.

``--ballast MB`` makes the caller hold that much memory in small Python objects
first, as a test session does; ``--workers both`` then sweeps with forked and
with fresh workers in turn (interleaved, so a slow moment of the machine hits
both) and prints each median and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from durably.sweep import CONFIGS, World, run_sweep
from durably.sweep.core import RUN_ID, StoreFactory, Workers, _fork, _SweepApprover
from durably.triage.job import TriageJob


def plain_run(
    job: TriageJob, *, store: StoreFactory | None = None, scratch_dir: str | None = None
) -> float:
    """Seconds for one uncrashed run in a forked process, from a fresh world to its checks."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="durably-bench-", dir=scratch_dir) as scratch:
        world = World(root=Path(scratch), config=CONFIGS[0], store_factory=store)
        job.prepare(world)

        def body() -> None:
            agent = job.agent(world, _SweepApprover(job, world))
            asyncio.run(agent.run(job.task(), run_id=RUN_ID))

        if _fork(body) != 0:
            raise RuntimeError("the plain run failed")
        failed = job.checks(world, world.store().read_sync(RUN_ID))
        if failed:
            raise RuntimeError(f"the plain run failed its checks: {failed}")
    return time.perf_counter() - started


def main() -> None:
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
    args = parser.parse_args()
    job = TriageJob(args.task)
    configs = [c for c in CONFIGS if c.name in args.config] if args.config else list(CONFIGS)
    ballast = [{"n": i, "text": str(i) * 20} for i in range(args.ballast * 4000)]
    if ballast:
        rss = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGESIZE")
        print(f"ballast: {len(ballast)} objects, caller's resident memory {rss >> 20} MB")
    for _ in range(3):  # warm: imports, compiled sample code, the recording
        plain_run(job)
    baseline = statistics.median(plain_run(job) for _ in range(args.baseline_runs))
    kinds: list[Workers] = ["fork", "fresh"] if args.workers == "both" else [args.workers]
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    report = None
    for attempt in range(1, args.repeat + 1):
        for kind in kinds:
            started = time.perf_counter()
            report = run_sweep(job, configs=configs, depth=args.depth, jobs=args.jobs, workers=kind)
            times[kind].append(time.perf_counter() - started)
            load = os.getloadavg()[0]
            print(f"run {attempt} ({kind}): {times[kind][-1]:.1f} s (load {load:.1f})", flush=True)
    assert report is not None
    walls = times[kinds[-1]]
    print(report.text())
    scenarios = len(report.results)
    points = sum(r.covers for r in report.results)
    wall = statistics.median(walls)
    per_scenario = wall * args.jobs / scenarios
    print(f"{scenarios} scenarios covering {points} crash points, {args.jobs} worker(s)")
    print(f"median wall time {wall:.1f} s over {len(walls)} run(s)", end=", ")
    print(f"{scenarios / wall:.1f} scenarios/s")
    print(f"baseline: one plain run in a forked process, median {baseline * 1000:.1f} ms")
    print(
        f"cost per scenario {per_scenario * 1000:.1f} ms of a worker = "
        f"{per_scenario / baseline:.2f}x a plain run"
    )
    if len(kinds) == 2:
        fork, fresh = (statistics.median(times[kind]) for kind in kinds)
        print(f"forked workers: median {fork:.1f} s; fresh workers: median {fresh:.1f} s")
        print(f"fresh / forked = {fresh / fork:.2f}")


if __name__ == "__main__":
    main()
