"""Checkpoint cost per turn of one Pydantic AI agent: Durable vs DBOSDurability vs the bare agent.

The agent runs on ``FunctionModel`` (no network): ``--turns`` turns, each a reply
calling one tool with about 1 KB of arguments and a tool result of about 1 KB, then
its answer. The contenders run the same agent side by side in one process, one turn
at a time in rotating order: the model function of each waits at a gate, and the
driver opens one gate at a time, so no contender's work overlaps another's.

A turn is timed from its gate opening (the model's reply handed back) to the next
model request reaching the gate: the reply's checkpoint, the tool call and its
checkpoints, and the next request's. Its bytes are what the process passed to
``write()`` over the same span (``wchar`` in ``/proc/self/io``; DBOS writes from
its own threads too, so the whole process is counted). The added latency of a
contender is its median turn minus the bare agent's median turn, measured in the
same run; its added bytes are its median bytes per turn minus the bare agent's.
Its CPU time per turn (``time.process_time`` over the same span: the whole process,
DBOS's threads too) is reported beside the latency: on a loaded machine the wall
clock of a turn is mostly waiting for a core, the CPU time much less so.

- bare: ``Agent(model)``, nothing saved.
- durably: ``Durable(JournalStore(dir))`` (fsync on), the tool declared ``keyed``.
- durably FileStore: ``Durable(FileStore(dir))`` (fsync on): the whole state per save.
- DBOS: ``DBOSDurability()`` with DBOS's SQLite system database, the run inside a
  ``@DBOS.workflow`` (DBOS records each model reply as a step; the tool runs in the
  workflow's code).

The comparison runs ``--repeat`` times (3 by default) on fresh files; the verdict
is on the median of each ratio over the runs. Targets (issue 34): durably's added
latency per turn at most 0.5x DBOS's, its bytes per turn at most 0.2x.

Run: ``.venv/bin/python benchmarks/pydantic_ai_turns.py [--repeat 3] [--turns 40] [--dir DIR]``.
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
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dbos import DBOS, SetWorkflowID
from pydantic_ai.durable_exec.dbos import DBOSDurability
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import durably
from durably._sysio import filesystem_type
from durably.pydantic_ai import Durable
from pydantic_ai import Agent

TARGETS = {"latency": 0.5, "bytes": 0.2}
"""durably / DBOS ratios of the added cost per turn the issue asks for (at most)."""

CONTENDERS = ("bare", "durably", "durably FileStore", "DBOS")
PAYLOAD = "x" * 1000


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

    def model(self) -> FunctionModel:
        """The scripted model: a keyed tool call per turn, then the answer."""

        async def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            turn = sum(isinstance(m, ModelResponse) for m in messages) + 1
            await self.wait()
            if turn > self.turns:
                return ModelResponse(parts=[TextPart("done")], model_name="scripted")
            call = ToolCallPart("record", {"text": PAYLOAD}, tool_call_id=f"call-{turn}")
            return ModelResponse(parts=[TextPart("Recording."), call], model_name="scripted")

        return FunctionModel(reply, model_name="scripted")

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
        self.arrived.set_result(None)

    async def let_on(self) -> None:
        """Open the gate and wait for the turn to reach it again (or the run to end)."""
        opened, self.opened, self.arrived = self.opened, Future(), Future()
        arrived = self.arrived
        opened.set_result(None)
        await asyncio.wrap_future(arrived)


def agent_for(name: str, gate: Gate, base: Path) -> tuple[Agent[None, str], Any]:
    """The contender's agent and the coroutine function that runs it once."""
    capabilities: list[Any] = []
    if name == "durably":
        capabilities = [Durable(durably.JournalStore(base / "journal"))]
    elif name == "durably FileStore":
        capabilities = [Durable(durably.FileStore(base / "files"))]
    elif name == "DBOS":
        capabilities = [DBOSDurability()]
    # A name per repeat: DBOS registers its steps under the agent's name, once each.
    agent: Agent[None, str] = Agent(
        gate.model(), name=f"bench_{base.parent.name}", capabilities=capabilities
    )

    @agent.tool_plain(metadata={"effect": "keyed", "key_ttl": 86400.0})
    async def record(text: str) -> str:
        """Record a text (about 1 KB back)."""
        return PAYLOAD

    run_id = "bench-" + name.replace(" ", "-")

    async def run() -> str:
        return str((await agent.run("record the texts", run_id=run_id)).output)

    if name == "DBOS":
        DBOS_RUNS[base.parent.name] = run

        async def in_workflow() -> str:
            with SetWorkflowID(f"bench-{base.parent.name}"):
                return await dbos_run(base.parent.name)

        return agent, in_workflow
    return agent, run


DBOS_RUNS: dict[str, Any] = {}
"""The DBOS contender's run of each repeat, by the repeat's directory name."""


@DBOS.workflow()
async def dbos_run(repeat: str) -> str:
    """The DBOS contender's agent run, as its integration asks: inside a workflow."""
    return str(await DBOS_RUNS[repeat]())


async def run_once(turns: int, base: Path) -> dict[str, Gate]:
    """Every contender's run, one turn at a time in rotating order."""
    gates = {name: Gate(name, turns) for name in CONTENDERS}
    runners = {
        name: agent_for(name, gates[name], base / name.replace(" ", "-"))[1] for name in CONTENDERS
    }

    async def run(name: str) -> None:
        try:
            await runners[name]()
        finally:
            gates[name].close()

    tasks = [asyncio.create_task(run(name)) for name in CONTENDERS]
    for gate in gates.values():  # each run's start, untimed: up to its first request
        await asyncio.wrap_future(gate.arrived)
    for turn in range(turns + 1):
        names = CONTENDERS[turn % len(CONTENDERS) :] + CONTENDERS[: turn % len(CONTENDERS)]
        for name in names:
            await gates[name].let_on()
    await asyncio.gather(*tasks)
    return gates


def summary(gates: dict[str, Gate]) -> dict[str, dict[str, float]]:
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


async def all_runs(repeat: int, turns: int, base: Path) -> list[dict[str, dict[str, float]]]:
    """``repeat`` comparisons, each on fresh files, with DBOS launched over them all."""
    DBOS.launch()
    try:
        return [summary(await run_once(turns, base / f"run{i}")) for i in range(repeat)]
    finally:
        DBOS.destroy()


def main() -> None:
    """Run the comparison ``--repeat`` times and print each run, the medians and the verdict."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs; the verdict is on the median")
    parser.add_argument("--turns", type=int, default=40, help="tool turns per run")
    parser.add_argument("--dir", type=Path, default=None, help="where the files go (a real disk)")
    args = parser.parse_args()
    logging.getLogger("dbos").setLevel(logging.WARNING)
    base = Path(tempfile.mkdtemp(prefix="durably-bench-pai-", dir=args.dir))
    try:
        DBOS(
            config={
                "name": "bench",
                "system_database_url": f"sqlite:///{base / 'dbos.sqlite'}",
                "log_level": "WARNING",
            }
        )
        started = time.perf_counter()
        runs = asyncio.run(all_runs(args.repeat, args.turns, base))
        wall = time.perf_counter() - started
        report(runs, args.turns, wall, filesystem_type(base))
    finally:
        shutil.rmtree(base, ignore_errors=True)


def report(
    runs: list[dict[str, dict[str, float]]], turns: int, wall: float, fs_type: str | None
) -> None:
    """Each contender's medians over the runs, then durably / DBOS and the verdict."""
    versions = ", ".join(
        f"{p} {importlib.metadata.version(p)}" for p in ("pydantic-ai-slim", "dbos", "durably")
    )
    print(
        f"Pydantic AI agent, {turns} tool turns, interleaved; {len(runs)} runs, {wall:.1f} s "
        f"in all; load average {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{platform.python_implementation()} {platform.python_version()}, {platform.machine()}, "
        f"{versions}; files on {fs_type}"
    )
    print()
    print(
        f"{'contender':<18} {'turns':>5} {'median ms':>10} {'added ms':>9} "
        f"{'bytes/turn':>11} {'added bytes':>12} {'cpu ms':>7} {'added cpu':>9}"
    )
    for name in CONTENDERS:

        def med(key: str, name: str = name) -> float:
            return float(statistics.median(run[name][key] for run in runs))

        print(
            f"{name:<18} {int(med('turns')):>5} {med('median_ms'):>10.3f} {med('added_ms'):>9.3f} "
            f"{int(med('bytes')):>11,} {int(med('added_bytes')):>12,} "
            f"{med('cpu_ms'):>7.3f} {med('added_cpu_ms'):>9.3f}"
        )
    print()
    for label, key in (("latency", "added_ms"), ("bytes", "added_bytes")):
        for name in ("durably", "durably FileStore"):
            found = [run[name][key] / run["DBOS"][key] for run in runs]
            ratio = statistics.median(found)
            each = ", ".join(f"{r:.3f}" for r in found)
            verdict = "meets" if ratio <= TARGETS[label] else "MISSES"
            print(
                f"{name} / DBOS added {label:<7}: {ratio:6.3f}x median of runs ({each}); "
                f"target <= {TARGETS[label]}x: {verdict}"
            )
    for name in ("durably", "durably FileStore"):
        found = [run[name]["added_cpu_ms"] / run["DBOS"]["added_cpu_ms"] for run in runs]
        each = ", ".join(f"{r:.3f}" for r in found)
        print(
            f"{name} / DBOS added cpu    : {statistics.median(found):6.3f}x median of runs "
            f"({each}); beside the latency, no target"
        )


if __name__ == "__main__":
    main()
