"""A fleet measured as it grows: W ``durably worker`` processes on one Postgres server.

For each configuration (W workers, C runs at once per worker), N short agent runs
(``benchmarks/_fleet_agent.py``: a scripted model that takes a while to answer each
turn, a keyed tool that takes a while and returns a few KB of incompressible text)
are queued with ``durably submit`` (one process per run, as a person or a cron job
submits them; all queued before the workers start, so the submitting processes' CPU
stays out of the window), then W real ``durably worker`` processes drain the queue.
Measured, from the first claim to the last run done:

- ``runs/s``: runs finished per second; ``saves/s``: saves per second (the rows'
  ``seq``, one per save);
- ``wait p50/p99``: from the run's submit (its row's ``created_at``) or the window's
  start, whichever is later, to its claim (its first model call): how long a queued
  run waits for a free slot; ``run p50/p99``: from claim to done (the row's
  ``saved_at`` at ``done``);
- ``srv ms/run``: the server's CPU per run (the postmaster and its children, from
  ``/proc``: live backends' ``utime + stime``, and the children that exited, in the
  postmaster's ``cutime + cstime``); ``wrk ms/run``: the workers' CPU per run;
- ``WAL/run``: ``pg_current_wal_lsn()`` moved, over the runs (their submit included).

Then, with the fleet of the last configuration idle, ``pickup``: a few runs
submitted one at a time, each timed from ``durably submit``'s row to the claim (the
workers' poll interval bounds it).

Every configuration is measured ``--repeat`` times, the repeats interleaved (all
configurations once, then again), and the table shows medians over repeats. This
machine is shared and small (2 cores, other engineers' tests beside): the figures
are medians and ratios to the smallest fleet, measured in the same run, never
absolute claims. ``--quick`` runs W = 1, 2, 4 at one concurrency, fewer runs, once.

Unless ``--dsn`` is given, a throwaway cluster is started (initdb/pg_ctl in a temp
dir on a loopback port, ``fsync=on``, as the tests start one) and removed after.

Run: ``.venv/bin/python benchmarks/fleet.py [--quick] [--workers 1,2,4,8]
[--concurrency 4,16] [--runs-per-slot 2] [--repeat 2] [--turns 6] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from durably.postgres import PostgresStore

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # _pg_cluster imports _helpers from there
sys.path.insert(0, str(HERE.parent / "tests" / "stores"))
from _pg_cluster import Cluster  # the tests' throwaway-cluster helper  # noqa: E402
from _pgproc import postmaster_pid, server_cpu, ticks  # noqa: E402

DURABLY = str(Path(sys.executable).with_name("durably"))
SUBMITTERS = 4
"""``durably submit`` processes at once while queueing a configuration's runs."""
PICKUPS = 5
"""Runs submitted one at a time to an idle fleet, for the pickup latency."""


@dataclass(frozen=True)
class Config:
    """One fleet: ``workers`` processes, ``concurrency`` runs at once in each."""

    workers: int
    concurrency: int
    runs: int

    @property
    def label(self) -> str:
        """``WxC``."""
        return f"{self.workers}x{self.concurrency}"


def sql(dsn: str, query: str, *params: object) -> list[tuple[Any, ...]]:
    """Run ``query`` on a connection of its own; the rows."""
    with psycopg.connect(dsn, autocommit=True, application_name="fleet-bench") as conn:
        cursor = conn.execute(query.encode(), params or None)
        return cursor.fetchall() if cursor.description else []


def wal_lsn(dsn: str) -> int:
    """The server's current WAL position, in bytes."""
    return int(sql(dsn, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")[0][0])


def environment(cluster_root: Path, dsn: str, agents: Sequence[str]) -> dict[str, str]:
    """The environment of ``durably submit`` and ``durably worker``: the agent module, the DSN."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
        "DURABLY_DSN": dsn,
        "FLEET_AGENTS": ",".join(agents),
        "FLEET_CLAIMS": str(cluster_root / "claims.txt"),
    }


def submit(env: dict[str, str], agent: str, run_id: str) -> None:
    """``durably submit`` one run."""
    subprocess.run(
        [DURABLY, "submit", "--import", "_fleet_agent", "--agent", agent, "--run", run_id],
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )


def submit_all(env: dict[str, str], agent: str, run_ids: Sequence[str]) -> None:
    """Queue every run, ``SUBMITTERS`` ``durably submit`` processes at a time."""
    with ThreadPoolExecutor(SUBMITTERS) as pool:
        list(pool.map(lambda run_id: submit(env, agent, run_id), run_ids))


class Fleet:
    """W ``durably worker`` processes serving one agent name."""

    def __init__(self, env: dict[str, str], config: Config, logs: Path, lease: float) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        for index in range(config.workers):
            out = (logs / f"{config.label}-{index}.log").open("wb")
            self.procs.append(
                subprocess.Popen(
                    [
                        DURABLY,
                        "worker",
                        "--import",
                        "_fleet_agent",
                        "--concurrency",
                        str(config.concurrency),
                        "--lease",
                        str(lease),
                        "--state",
                        str(logs / "state"),
                    ],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )

    def cpu(self) -> float:
        """The workers' CPU seconds so far."""
        return sum(ticks(p.pid) for p in self.procs) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        """SIGTERM every worker and wait for it."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def claims(path: Path) -> dict[str, float]:
    """Each run's claim time (its first model call), from the agents' claims file."""
    found: dict[str, float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            run_id, _, when = line.partition(" ")
            found.setdefault(run_id, float(when))
    return found


def wait_done(dsn: str, agent: str, count: int, timeout: float) -> None:
    """Wait until ``count`` runs of ``agent`` are done."""
    deadline = time.monotonic() + timeout
    while True:
        done = sql(
            dsn, "SELECT count(*) FROM durably_runs WHERE agent = %s AND phase = 'done'", agent
        )[0][0]
        if done >= count:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{agent}: {done} of {count} runs done after {timeout:.0f}s")
        time.sleep(0.2)


def percentile(samples: list[float], q: int) -> float:
    """The q-th percentile of the samples."""
    if len(samples) < 2:
        return samples[0] if samples else float("nan")
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1]


def measure(
    cluster: Cluster, dsn: str, config: Config, tag: str, logs: Path, *, lease: float
) -> dict[str, Any]:
    """One configuration's figures."""
    agent = f"fleet-{config.label}-{tag}"
    env = environment(cluster.root, dsn, [agent])
    run_ids = [f"{agent}-{n:04d}" for n in range(config.runs)]
    postmaster = postmaster_pid(cluster.data)
    wal0 = wal_lsn(dsn)
    submit_all(env, agent, run_ids)
    cpu0 = server_cpu(postmaster)
    fleet = Fleet(env, config, logs, lease)
    try:
        wait_done(dsn, agent, config.runs, timeout=120 + config.runs * 5)
        cpu1 = server_cpu(postmaster)
        worker_cpu = fleet.cpu()
        wal1 = wal_lsn(dsn)
    finally:
        fleet.stop()
    rows = sql(
        dsn,
        "SELECT run_id, extract(epoch FROM created_at)::float8, "
        "extract(epoch FROM saved_at)::float8, seq FROM durably_runs WHERE agent = %s",
        agent,
    )
    claimed = claims(cluster.root / "claims.txt")
    start = min(claimed[r[0]] for r in rows)
    end = max(r[2] for r in rows)
    waits = [claimed[r[0]] - max(r[1], start) for r in rows]
    runs = [r[2] - claimed[r[0]] for r in rows]
    saves = sum(int(r[3]) for r in rows)
    elapsed = end - start
    # Worker start-up (imports, connections) is before the window; its CPU is in
    # wrk ms/run, but it is small beside the runs'.
    return {
        "config": config.label,
        "workers": config.workers,
        "concurrency": config.concurrency,
        "runs": config.runs,
        "seconds": elapsed,
        "runs_per_s": config.runs / elapsed,
        "saves_per_s": saves / elapsed,
        "saves_per_run": saves / config.runs,
        "wait_p50": percentile(waits, 50),
        "wait_p99": percentile(waits, 99),
        "run_p50": percentile(runs, 50),
        "run_p99": percentile(runs, 99),
        "server_ms_per_run": (cpu1 - cpu0) / config.runs * 1000,
        "worker_ms_per_run": worker_cpu / config.runs * 1000,
        "wal_per_run": (wal1 - wal0) / config.runs,
    }


def pickup(cluster: Cluster, dsn: str, config: Config, logs: Path, *, lease: float) -> list[float]:
    """Seconds from ``durably submit``'s row to the claim, to an idle fleet of ``config``.

    The runs are submitted one at a time, each after the one before is done.
    """
    agent = f"fleet-pickup-{config.label}"
    env = environment(cluster.root, dsn, [agent])
    fleet = Fleet(env, config, logs, lease)
    found: list[float] = []
    try:
        time.sleep(3)  # the workers are up and polling
        for n in range(PICKUPS):
            run_id = f"{agent}-{n}"
            submit(env, agent, run_id)
            wait_done(dsn, agent, n + 1, timeout=60)
            created = sql(
                dsn,
                "SELECT extract(epoch FROM created_at)::float8 FROM durably_runs WHERE run_id = %s",
                run_id,
            )[0][0]
            found.append(claims(cluster.root / "claims.txt")[run_id] - created)
    finally:
        fleet.stop()
    return found


def print_table(rows: list[dict[str, Any]], base: dict[str, Any]) -> None:
    """One row per configuration: medians over repeats, and ratios to the smallest fleet."""
    header = (
        f"{'fleet':>6} {'runs':>5} | {'runs/s':>7} {'x1':>5} {'saves/s':>8} {'x1':>5} | "
        f"{'wait p50':>8} {'p99':>6} | {'run p50':>7} {'p99':>6} {'x1':>5} | "
        f"{'srv ms/run':>10} {'wrk ms/run':>10} | {'WAL/run':>8}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row['config']:>6} {row['runs']:>5} | {row['runs_per_s']:>7.2f} "
            f"{row['runs_per_s'] / base['runs_per_s']:>5.2f} {row['saves_per_s']:>8.0f} "
            f"{row['saves_per_s'] / base['saves_per_s']:>5.2f} | "
            f"{row['wait_p50']:>7.2f}s {row['wait_p99']:>5.2f}s | "
            f"{row['run_p50']:>6.2f}s {row['run_p99']:>5.2f}s "
            f"{row['run_p50'] / base['run_p50']:>5.2f} | "
            f"{row['server_ms_per_run']:>10.1f} {row['worker_ms_per_run']:>10.1f} | "
            f"{row['wal_per_run'] / 1024:>6.1f}KB"
        )


def medians(repeats: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each configuration's figures, the median over repeats of each number."""
    out = []
    for index, first in enumerate(repeats[0]):
        merged = dict(first)
        for key, value in first.items():
            if isinstance(value, float):
                merged[key] = statistics.median(r[index][key] for r in repeats)
        out.append(merged)
    return out


def parse_list(text: str) -> list[int]:
    """``"1,2,4"`` as numbers."""
    return [int(part) for part in text.split(",") if part]


def main(argv: Sequence[str] | None = None, *, say: Callable[[str], None] = print) -> None:
    """Run the benchmark and print the table (``--help`` lists the options)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="use this server instead of a throwaway cluster")
    parser.add_argument("--quick", action="store_true", help="W = 1, 2, 4; C = 4; once")
    parser.add_argument("--workers", type=parse_list, default=[1, 2, 4, 8])
    parser.add_argument("--concurrency", type=parse_list, default=[4, 16])
    parser.add_argument(
        "--runs-per-slot", type=float, default=2.0, help="runs per slot (W x C) in a fleet"
    )
    parser.add_argument("--repeat", type=int, default=2, help="interleaved repeats")
    parser.add_argument("--turns", type=int, default=6, help="model turns per run")
    parser.add_argument("--model-seconds", type=float, default=0.2, help="each model reply")
    parser.add_argument("--tool-seconds", type=float, default=0.05, help="each tool call")
    parser.add_argument("--tool-bytes", type=int, default=3000, help="each tool result")
    parser.add_argument("--lease", type=float, default=15.0, help="workers' lease, seconds")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.workers, args.concurrency, args.repeat, args.runs_per_slot = [1, 2, 4], [4], 1, 1.5
    os.environ.update(
        FLEET_TURNS=str(args.turns),
        FLEET_MODEL_SECONDS=str(args.model_seconds),
        FLEET_TOOL_SECONDS=str(args.tool_seconds),
        FLEET_TOOL_BYTES=str(args.tool_bytes),
    )
    configs = [
        Config(w, c, max(8, round(w * c * args.runs_per_slot)))
        for c in args.concurrency
        for w in args.workers
    ]
    load = os.getloadavg()
    cluster = Cluster.start() if not args.dsn else None
    if cluster is None:
        raise SystemExit("--dsn: the benchmark reads the server's CPU from /proc; run it locally")
    repeats: list[list[dict[str, Any]]] = []
    picked: list[float] = []
    with tempfile.TemporaryDirectory(prefix="durably-fleet-") as scratch:
        logs = Path(scratch)
        try:
            dsn = cluster.dsn
            asyncio.run(_migrate(dsn))
            for number in range(args.repeat):
                rows = []
                for config in configs:
                    row = measure(cluster, dsn, config, f"r{number}", logs, lease=args.lease)
                    say(
                        f"  repeat {number + 1}, {config.label}: {row['runs_per_s']:.2f} runs/s, "
                        f"{row['saves_per_s']:.0f} saves/s"
                    )
                    rows.append(row)
                repeats.append(rows)
            picked = pickup(cluster, dsn, configs[-1], logs, lease=args.lease)
        finally:
            cluster.stop()
    table = medians(repeats)
    say("")
    say(
        f"{args.turns} turns a run (model {args.model_seconds:g}s, keyed tool "
        f"{args.tool_seconds:g}s, {args.tool_bytes} bytes a result), runs queued with "
        f"`durably submit`, drained by W `durably worker` processes x C runs at once; "
        f"one local server, fsync=on; {platform.python_implementation()} "
        f"{platform.python_version()}, {os.cpu_count()} cores, load average "
        f"{load[0]:.1f} at start; medians of {len(repeats)} interleaved repeat(s)"
    )
    say(
        "A shared small machine: read the ratios (x1: over the first fleet of the same C) "
        "and the medians, not the absolute figures."
    )
    say("")
    for concurrency in args.concurrency:
        rows = [r for r in table if r["concurrency"] == concurrency]
        print_table(rows, rows[0])
        say("")
    say(
        "wait = submit (or window start, if later) to claim: time queued; run = claim to done; "
        "srv/wrk ms/run = CPU of the server / of the workers per run; WAL/run includes the "
        "submit"
    )
    if picked:
        say(
            f"pickup by an idle {configs[-1].label} fleet, {len(picked)} runs submitted one at "
            f"a time: median {statistics.median(picked):.2f}s, max {max(picked):.2f}s "
            "(the workers poll every 0.5 s)"
        )
    if args.json:
        args.json.write_text(json.dumps({"repeats": repeats, "pickup": picked}, indent=2) + "\n")


async def _migrate(dsn: str) -> None:
    async with PostgresStore(dsn) as store:
        await store.migrate()


if __name__ == "__main__":
    main()
