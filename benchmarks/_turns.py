"""What the per-turn benchmarks of the front ends share: gates, interleaving, medians, ratios.

``pydantic_ai_turns.py`` and ``openai_agents_turns.py`` each run the same agent under
several contenders side by side in one process, one turn at a time in rotating
order: the scripted model of each waits at a :class:`Gate`, and the driver opens one
gate at a time, so no contender's work overlaps another's. A turn is timed from its
gate opening (the model's reply handed back) to the next model request reaching the
gate; its bytes are what the process passed to ``write()`` over the same span
(``wchar`` in ``/proc/self/io``; DBOS writes from its own threads too, so the whole
process is counted). A contender's added latency is its median turn minus the bare
agent's, measured in the same run; its added bytes likewise.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import logging
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from durably._sysio import filesystem_type

TARGETS = {"latency": 0.5, "bytes": 0.2}
"""Issues 34 and 36: durably's added latency and bytes per turn at most these ratios to DBOS's."""

OURS = ("durably", "durably FileStore")
"""The contenders that are durably; each is held against the peer, DBOS."""

PAYLOAD = "x" * 1000
"""About 1 KB: each turn's tool arguments and its tool result."""

Summary = dict[str, dict[str, float]]
"""One run's medians by contender: ``median_ms``, ``bytes``, ``cpu_ms``, ``turns``, ``added_*``.

``cpu_ms`` is ``time.process_time`` over the turn: the whole process, the peer's threads too.
"""


def wchar() -> int:
    """Bytes the whole process has passed to write() so far."""
    with open("/proc/self/io", "rb") as io:
        for line in io:
            if line.startswith(b"wchar:"):
                return int(line.split()[1])
    raise RuntimeError("no wchar in /proc/self/io")


@dataclass
class Gate:
    """Where one contender's model requests wait for the driver, and what each turn cost."""

    name: str
    turns: int
    # Futures, not asyncio events: DBOS runs a model step on an event loop of its own.
    opened: Future[None] = field(default_factory=Future)
    arrived: Future[None] = field(default_factory=Future)
    started: tuple[float, int, float] = (0.0, 0, 0.0)
    latencies: list[float] = field(default_factory=list)
    written: list[int] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    ended: bool = False

    async def wait(self) -> None:
        """Close the turn that led here (its time and bytes), then wait to be let on."""
        now, written, cpu = time.perf_counter(), wchar(), time.process_time()
        if self.started != (0.0, 0, 0.0):
            self.latencies.append(now - self.started[0])
            self.written.append(written - self.started[1])
            self.cpu.append(cpu - self.started[2])
        opened = self.opened
        self.arrived.set_result(None)
        await asyncio.wrap_future(opened)
        self.started = (time.perf_counter(), wchar(), time.process_time())

    def close(self) -> None:
        """The run ended: close its last turn."""
        self.latencies.append(time.perf_counter() - self.started[0])
        self.written.append(wchar() - self.started[1])
        self.cpu.append(time.process_time() - self.started[2])
        self.ended = True
        if not self.arrived.done():
            self.arrived.set_result(None)

    async def let_on(self) -> None:
        """Open the gate and wait for the turn to reach it again (or the run to end)."""
        if self.ended:  # the run failed early: interleave's gather raises its error
            return
        opened, self.opened, self.arrived = self.opened, Future(), Future()
        arrived = self.arrived
        opened.set_result(None)
        await asyncio.wrap_future(arrived)


async def interleave(
    gates: Mapping[str, Gate], runners: Mapping[str, Callable[[], Awaitable[object]]], turns: int
) -> None:
    """Run every contender's run, one turn at a time in rotating order."""
    names = list(gates)

    async def run(name: str) -> None:
        try:
            await runners[name]()
        finally:
            gates[name].close()

    tasks = [asyncio.create_task(run(name)) for name in names]
    for gate in gates.values():  # each run's start, untimed: up to its first request
        await asyncio.wrap_future(gate.arrived)
    for turn in range(turns + 1):
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            await gates[name].let_on()
    await asyncio.gather(*tasks)


def summary(gates: Mapping[str, Gate]) -> Summary:
    """Median latency and bytes per turn of each contender, and what it adds to the bare agent."""
    rows = {
        name: {
            "median_ms": statistics.median(g.latencies) * 1e3,
            "bytes": statistics.median(g.written),
            "cpu_ms": statistics.median(g.cpu) * 1e3,
            "turns": len(g.latencies),
        }
        for name, g in gates.items()
    }
    for row in rows.values():
        row["added_ms"] = row["median_ms"] - rows["bare"]["median_ms"]
        row["added_bytes"] = row["bytes"] - rows["bare"]["bytes"]
        row["added_cpu_ms"] = row["cpu_ms"] - rows["bare"]["cpu_ms"]
    return rows


def report(
    runs: Sequence[Summary],
    *,
    heading: str,
    versions: str,
    fs_type: str | None,
    ours: Sequence[str],
    peer: str,
    targets: Mapping[str, float],
) -> None:
    """Each contender's medians over the runs, then each of ``ours`` / ``peer`` and the verdict."""
    print(f"{heading}; {len(runs)} runs; load average {os.getloadavg()[0]:.2f}")
    print(
        f"{platform.python_implementation()} {platform.python_version()}, {platform.machine()}, "
        f"{versions}; files on {fs_type}"
    )
    print()
    print(
        f"{'contender':<18} {'turns':>5} {'median ms':>10} {'added ms':>9} "
        f"{'bytes/turn':>11} {'added bytes':>12} {'added cpu ms':>12}"
    )
    for name in runs[0]:

        def med(key: str, name: str = name) -> float:
            return float(statistics.median(run[name][key] for run in runs))

        print(
            f"{name:<18} {int(med('turns')):>5} {med('median_ms'):>10.3f} {med('added_ms'):>9.3f} "
            f"{int(med('bytes')):>11,} {int(med('added_bytes')):>12,} {med('added_cpu_ms'):>12.3f}"
        )
    print()
    for label, key in (("latency", "added_ms"), ("bytes", "added_bytes"), ("cpu", "added_cpu_ms")):
        for name in ours:
            found = [run[name][key] / run[peer][key] for run in runs]
            ratio = statistics.median(found)
            each = ", ".join(f"{r:.3f}" for r in found)
            verdict = (
                "(no target: steadier than wall time on a loaded machine)"
                if label not in targets
                else f"target <= {targets[label]}x: "
                + ("meets" if ratio <= targets[label] else "MISSES")
            )
            print(
                f"{name} / {peer} added {label:<7}: {ratio:6.3f}x median of runs ({each}); "
                f"{verdict}"
            )


def main(
    *,
    description: str,
    agent: str,
    prefix: str,
    packages: Sequence[str],
    run_once: Callable[[int, Path], Awaitable[Summary]],
) -> None:
    """The command line of a per-turn benchmark against DBOS on SQLite, and its report.

    ``run_once(turns, base)`` runs every contender once on fresh files below ``base``;
    DBOS is configured on ``base`` and launched around all the repeats.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--repeat", type=int, default=3, help="runs; the verdict is on the median")
    parser.add_argument("--turns", type=int, default=40, help="tool turns per run")
    parser.add_argument("--dir", type=Path, default=None, help="where the files go (a real disk)")
    args = parser.parse_args()
    from dbos import DBOS  # the peer: every contender's module imports it too

    logging.getLogger("dbos").setLevel(logging.WARNING)
    base = Path(tempfile.mkdtemp(prefix=prefix, dir=args.dir))

    async def all_runs() -> list[Summary]:
        DBOS.launch()
        try:
            return [await run_once(args.turns, base / f"run{i}") for i in range(args.repeat)]
        finally:
            DBOS.destroy()

    try:
        DBOS(
            config={
                "name": "bench",
                "system_database_url": f"sqlite:///{base / 'dbos.sqlite'}",
                "log_level": "WARNING",
            }
        )
        started = time.perf_counter()
        runs = asyncio.run(all_runs())
        wall = time.perf_counter() - started
        report(
            runs,
            heading=f"{agent}, {args.turns} tool turns, interleaved; {wall:.1f} s in all",
            versions=", ".join(f"{p} {importlib.metadata.version(p)}" for p in packages),
            fs_type=filesystem_type(base),
            ours=OURS,
            peer="DBOS",
            targets=TARGETS,
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
