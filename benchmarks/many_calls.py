"""One reply with thousands of tool calls: the loop's time must grow linearly with the count.

A model answers turn 1 with N calls of a read tool, then gives its answer. Each
call's result is saved (save point 4), so a run makes N + 4 saves. The script
times whole runs for N and 10 x N on the journal store (sync off: this measures
the loop and the store's CPU work, not the disk) and prints the ratio: about 10
is linear, about 100 quadratic. The snapshot store rewrites the whole state on
every save, so its time grows with the square of the count by design; it is
shown with ``--snapshot`` for comparison.

Run: ``.venv/bin/python benchmarks/many_calls.py [--calls 1000] [--snapshot]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import durably
from durably import Agent, Call, Effect, Reply, ScriptedModel, ToolContext, Usage
from durably.stores.file import FileStore
from durably.stores.journal import JournalStore


@durably.tool(effect=Effect.READ)
async def stock(ctx: ToolContext, item: int) -> str:
    """How many of an item are in stock."""
    return f"item {item}: 12 in stock"


def one_run(calls: int, store_type: type[FileStore], directory: Path) -> float:
    """Seconds for one run whose first reply has ``calls`` calls."""
    replies = [
        Reply(
            calls=[Call(f"c{n}", "stock", f'{{"item": {n}}}') for n in range(calls)],
            usage=Usage(input_tokens=100, output_tokens=20 * calls),
        ),
        Reply(text="all counted", usage=Usage(input_tokens=100, output_tokens=5)),
    ]
    store = store_type(directory, sync=False)
    agent = Agent(model=ScriptedModel(replies), tools=[stock], store=store)
    try:
        started = time.perf_counter()
        outcome = asyncio.run(agent.run("count the stock", name="many"))
        took = time.perf_counter() - started
    finally:
        store.close_sync()
    if outcome.status != "done":
        raise SystemExit(f"the run ended {outcome.status}")
    return took


def main() -> None:
    """Run the benchmark and print the table (``--help`` lists the options)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="N (the larger run has 10 N)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each size (median)")
    parser.add_argument("--snapshot", action="store_true", help="also time the snapshot store")
    args = parser.parse_args()
    stores: list[type[FileStore]] = [JournalStore] + ([FileStore] if args.snapshot else [])
    with tempfile.TemporaryDirectory(prefix="durably-many-") as base:
        for store_type in stores:
            medians = {}
            for calls in (args.calls, 10 * args.calls):
                samples = [
                    one_run(calls, store_type, Path(base) / f"{store_type.__name__}-{calls}-{r}")
                    for r in range(args.rounds)
                ]
                medians[calls] = statistics.median(samples)
                print(
                    f"{store_type.__name__:<13} {calls:>6} calls: {medians[calls]:8.2f} s "
                    f"({medians[calls] / calls * 1e6:7.1f} us per call, median of {args.rounds})"
                )
            ratio = medians[10 * args.calls] / medians[args.calls]
            print(f"{store_type.__name__:<13} 10x the calls took {ratio:.1f}x the time")


if __name__ == "__main__":
    main()
