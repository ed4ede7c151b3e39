"""How long the whole system-call sweep takes, and what one of its scenarios costs.

    .venv/bin/python benchmarks/syscall_sweep.py [--depth 1|2] [--jobs N] [--repeat N]
    .venv/bin/python benchmarks/syscall_sweep.py --sample 2 --depth 2   # the CI sample

Runs ``durably sweep --syscalls`` over the reference job (both file stores,
synced, scenario worlds in /dev/shm) ``--repeat`` times and prints the table
once, then the median wall time. The baseline, measured in the same run on the
same machine: one uncrashed run of the same synced job, in a process forked
from this one, from a fresh world (in the same scratch directory) to its judged
end (median of ``--baseline-runs``). The cost per scenario is reported as a
multiple of it (wall time x workers / scenarios / baseline): how many plain
runs one scenario (a traced, killed process, its restarts, its judging) costs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import sweep as sweep_benchmark  # benchmarks/sweep.py, beside this script: its plain run

from durably.sweep import scratch_root
from durably.sweep.syscalls import run_syscall_sweep, triage_stores
from durably.triage.job import TriageJob


def plain_run(job: TriageJob, store_name: str) -> float:
    """Seconds for one uncrashed synced run in a forked process, fresh world to judged end."""
    wall, _ = sweep_benchmark.plain_run(
        job, store=triage_stores()[store_name], scratch_dir=scratch_root()
    )
    return wall


def main() -> None:
    """Run the benchmark, print the ratio and whether the target is met."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--depth", type=int, choices=(1, 2), default=1)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--task", default="m1-done-after-delete")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sample", type=int, default=None, help="kills per call kind at most")
    parser.add_argument("--baseline-runs", type=int, default=20)
    args = parser.parse_args()
    job = TriageJob(args.task, sync=True)
    for _ in range(3):  # warm: imports, compiled sample code, the recording
        plain_run(job, "snapshot")
    baseline = statistics.median(
        plain_run(job, store) for _ in range(args.baseline_runs // 2) for store in triage_stores()
    )
    walls: list[float] = []
    report = None
    for attempt in range(1, args.repeat + 1):
        started = time.perf_counter()
        report = run_syscall_sweep(
            job, triage_stores(), depth=args.depth, jobs=args.jobs, sample=args.sample
        )
        walls.append(time.perf_counter() - started)
        load = os.getloadavg()[0]
        print(f"run {attempt}: {walls[-1]:.1f} s (load {load:.1f})", flush=True)
    assert report is not None
    print(report.text())
    problems = report.problems()
    print(f"problems: {len(problems)}", *problems[:5], sep="\n  ")
    scenarios = len(report.report.results)
    points = sum(r.covers for r in report.report.results)
    wall = statistics.median(walls)
    per_scenario = wall * args.jobs / scenarios
    print(
        f"{scenarios} scenarios (real kills) covering {points} kill points, {args.jobs} worker(s)"
    )
    print(f"median wall time {wall:.1f} s over {len(walls)} run(s)", end=", ")
    print(f"{scenarios / wall:.1f} scenarios/s")
    print(f"baseline: one plain synced run in a forked process, median {baseline * 1000:.1f} ms")
    print(
        f"cost per scenario {per_scenario * 1000:.1f} ms of a worker = "
        f"{per_scenario / baseline:.2f}x a plain run"
    )


if __name__ == "__main__":
    main()
