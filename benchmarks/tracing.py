"""What tracing costs a run: off (no tracer provider), on (the SDK, in-memory), and the hooks.

A model answers turn 1 with N calls of a read tool, then gives its answer; the
run is on the journal store with sync off, so the time is the loop's and the
store's CPU work. The two contenders alternate, run by run: tracing off (the
engine's no-op hooks, as in a program without OpenTelemetry) and tracing on (the
OpenTelemetry SDK with a simple processor into the in-memory exporter, the
cheapest real exporter). Then it times the off hooks alone, as the engine calls
them for one tool call (one ``tool_call`` context and three events), against the
off run's time per call: the share of a call that tracing costs when it is off.

Run: ``.venv/bin/python benchmarks/tracing.py [--calls 300] [--runs 9]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import durably
from durably import Agent, Call, Effect, Reply, ScriptedModel, ToolContext, Usage, _tracing
from durably.stores.journal import JournalStore


@durably.tool(effect=Effect.READ)
async def stock(ctx: ToolContext, item: int) -> str:
    """How many of an item are in stock."""
    return f"item {item}: 12 in stock"


def one_run(calls: int, directory: Path, n: int) -> float:
    """Seconds for one run whose first reply has ``calls`` calls."""
    replies = [
        Reply(
            calls=[Call(f"c{i}", "stock", f'{{"item": {i}}}') for i in range(calls)],
            usage=Usage(input_tokens=100, output_tokens=20 * calls),
        ),
        Reply(text="all counted", usage=Usage(input_tokens=100, output_tokens=5)),
    ]
    store = JournalStore(directory, sync=False)
    agent = Agent(model=ScriptedModel(replies), tools=[stock], store=store)
    try:
        started = time.perf_counter()
        outcome = asyncio.run(agent.run("count the stock", run_id=f"run-{n}"))
        took = time.perf_counter() - started
    finally:
        store.close_sync()
    if outcome.status != "done":
        raise SystemExit(f"the run ended {outcome.status}")
    return took


def hooks_per_call(rounds: int = 20000) -> float:
    """Seconds the off hooks take for one tool call (its context and three events)."""
    off = _tracing.OFF
    data: dict[str, Any] = {"call_id": "c1", "tool": "stock"}
    started = time.perf_counter()
    for _ in range(rounds):
        with off.tool_call(
            turn=1, call_id="c1", tool="stock", effect="read", key=None, marker="none"
        ):
            pass
        off.event("call", data, state=None)
        off.event("result", data, state=None)
        off.event("reply", data, state=None)
    return (time.perf_counter() - started) / rounds


def main() -> None:
    """Run the benchmark and print its lines (``--help`` lists the options)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="tool calls in the run")
    parser.add_argument("--runs", type=int, default=9, help="runs of each contender")
    options = parser.parse_args()

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("durably")
    real = _tracing.for_run

    def traced(run_id: str, *, owner: object, state: object) -> _tracing.RunTrace:
        return _tracing.RunTrace(run_id, tracer, owner=owner, state=state)

    times: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as root:
        one_run(options.calls, Path(root) / "warm", 0)
        for n in range(options.runs):
            for mode in ("off", "on") if n % 2 == 0 else ("on", "off"):
                _tracing.for_run = traced if mode == "on" else real
                try:
                    times[mode].append(one_run(options.calls, Path(root) / f"{mode}{n}", n))
                finally:
                    _tracing.for_run = real
                exporter.clear()
    off, on = (statistics.median(times[m]) for m in ("off", "on"))
    per_call = off / options.calls
    hooks = hooks_per_call()
    print(f"{options.calls} calls, median of {options.runs} runs each")
    print(f"tracing off: {off * 1e3:8.1f} ms  ({per_call * 1e6:.0f} us per call)")
    print(f"tracing on:  {on * 1e3:8.1f} ms  ({on / off:.2f}x off)")
    print(f"off hooks per call: {hooks * 1e6:.2f} us ({hooks / per_call:.2%} of a call)")


if __name__ == "__main__":
    main()
