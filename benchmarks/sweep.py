"""How fast the default crash sweep runs: scenarios per second and total wall time.

    .venv/bin/python benchmarks/sweep.py [--depth 1|2] [--jobs N]

Runs the reference triage job's default sweep (every configuration; depth 2 for
the protected ones) and prints the scenario counts per row, the wall time, and
scenarios per second. Absolute times depend on the machine and its load; run it
on a quiet machine and compare runs made on the same one.
"""

from __future__ import annotations

import argparse
import os
import time

from durably.sweep import CONFIGS, run_sweep
from durably.triage.job import TriageJob


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--depth", type=int, choices=(1, 2), default=2)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--task", default="m1-done-after-delete")
    args = parser.parse_args()
    started = time.perf_counter()
    report = run_sweep(TriageJob(args.task), configs=CONFIGS, depth=args.depth, jobs=args.jobs)
    elapsed = time.perf_counter() - started
    print(report.text())
    scenarios = len(report.results)
    points = sum(r.covers for r in report.results)
    print(f"{scenarios} scenarios covering {points} crash points, {args.jobs} worker(s)")
    print(f"wall time {elapsed:.1f} s, {scenarios / elapsed:.1f} scenarios/s")
    load = os.getloadavg()
    print(f"load average during the run: {load[0]:.1f} (1 min)")


if __name__ == "__main__":
    main()
