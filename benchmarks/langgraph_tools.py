"""What ``DurableTools`` adds to each tool call of a LangGraph graph.

The graph is the tool-calling agent of ``tests/langgraph/_lg_agent.py`` (a scripted
chat model; ``--rounds`` rounds of a reply calling the ``lookup`` tool, whose result
is about 1 KB), on LangGraph's ``InMemorySaver`` so that no checkpoint is written to
disk. Its ``ToolNode`` runs every call through a timing ``wrap_tool_call``, which
calls one of three contenders inside it:

- ``plain``: LangGraph's own ``execute(request)``, nothing durable;
- ``read``: ``DurableTools(JournalStore(dir), effects={"lookup": "read"})``: the
  reply is saved at its first call and each result is saved;
- ``keyed``: the same with ``effects={"lookup": "keyed"}``: the attempt marker is
  saved (fsynced) before the tool runs and the result after it, as for any call
  that can act.

The store syncs to disk (fsync on). The three contenders run interleaved: one
whole run of each per repeat, in an order that rotates with the repeat. A call's
latency is the time inside the timing wrapper (LangGraph's ``ToolNode`` around it
is the same for all three). Reported: the median and p99 per call over every
repeat, the median over ``plain``'s, and the milliseconds added per call. No
target is set for it in the issue ("reported"); the figures are this machine's.

Run: ``.venv/bin/python benchmarks/langgraph_tools.py [--rounds 50] [--repeat 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this file's directory comes first on sys.path and benchmarks/langgraph.py
# would be imported as `langgraph`: take the directory out before importing LangGraph.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks"]
sys.path.insert(0, str(ROOT / "tests" / "langgraph"))

from _lg_agent import ScriptedChatModel, lookup, question, script  # noqa: E402
from langchain_core.messages import BaseMessage  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import ToolNode, tools_condition  # noqa: E402

from durably.langgraph import DurableTools  # noqa: E402
from durably.langgraph._thread import thread_key  # noqa: E402
from durably.state import ToolResult  # noqa: E402
from durably.stores.journal import JournalStore  # noqa: E402

CONTENDERS = ("plain", "read", "keyed")

Inner = Callable[[Any, Callable[[Any], Any]], Any]


def graph(inner: Inner, latencies: list[float], rounds: int) -> Any:
    """The agent graph whose tool calls each go through ``inner``, timed."""
    model = ScriptedChatModel(responses=script(rounds))

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    def timed(request: Any, execute: Callable[[Any], Any]) -> Any:
        started = time.perf_counter()
        try:
            return inner(request, execute)
        finally:
            latencies.append(time.perf_counter() - started)

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([lookup], wrap_tool_call=timed))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=InMemorySaver())


def run_once(name: str, base: Path, rounds: int, tag: int) -> list[float]:
    """One whole run of the agent with contender ``name``: its per-call latencies."""
    latencies: list[float] = []
    if name == "plain":

        def inner(request: Any, execute: Callable[[Any], Any]) -> Any:
            return execute(request)

        compiled = graph(inner, latencies, rounds)
    else:
        tools = DurableTools(JournalStore(base / f"{name}-{tag}"), effects={"lookup": name})
        compiled = graph(tools.wrap_tool_call, latencies, rounds)
    thread_id = f"bench-{name}-{tag}"
    compiled.invoke(
        question(), {"configurable": {"thread_id": thread_id}, "recursion_limit": 10_000}
    )
    if len(latencies) != rounds:
        raise RuntimeError(f"{name}: {len(latencies)} tool calls timed, {rounds} expected")
    if name != "plain":
        saved = asyncio.run(saved_results(base / f"{name}-{tag}", thread_key(thread_id)))
        if saved != rounds:  # a call the wrapper passed through would time like plain
            raise RuntimeError(f"{name}: {saved} results saved for {rounds} calls")
    return latencies


async def saved_results(directory: Path, run_id: str) -> int:
    """How many tool results the run of a thread holds in its store."""
    async with JournalStore(directory) as store:
        state = await store.read(run_id)
    return sum(isinstance(message, ToolResult) for message in state.messages)


def p99(values: list[float]) -> float:
    """The 99th percentile (inclusive method)."""
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def main() -> None:
    """Run the contenders interleaved and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=50, help="tool calls per run")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each contender")
    args = parser.parse_args()
    if args.rounds < 1 or args.repeat < 1:
        parser.error("--rounds and --repeat must be 1 or more")

    calls: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    with tempfile.TemporaryDirectory(prefix="durably-lg-tools-") as tmp:
        base = Path(tmp)
        for name in CONTENDERS:  # warm-up: imports, first store
            run_once(name, base / "warm", 2, -1)
        for repeat in range(args.repeat):
            shift = repeat % len(CONTENDERS)
            for name in CONTENDERS[shift:] + CONTENDERS[:shift]:
                calls[name].extend(run_once(name, base, args.rounds, repeat))

    print(
        f"LangGraph ToolNode, {args.rounds} tool calls a run, {args.repeat} runs of each, "
        f"interleaved; load average {os.getloadavg()[0]:.2f}"
    )
    print(f"CPython {platform.python_version()}, {platform.machine()}, store fsync on")
    plain = statistics.median(calls["plain"])
    print(f"{'contender':<10}{'calls':>7}{'median ms':>11}{'p99 ms':>9}{'x plain':>9}{'+ms':>8}")
    for name in CONTENDERS:
        median = statistics.median(calls[name])
        print(
            f"{name:<10}{len(calls[name]):>7}{median * 1e3:>11.3f}{p99(calls[name]) * 1e3:>9.3f}"
            f"{median / plain:>9.2f}{(median - plain) * 1e3:>8.3f}"
        )
    print("+ms = what DurableTools adds to a call's median: its saves (fsynced) and its engine")


if __name__ == "__main__":
    main()
