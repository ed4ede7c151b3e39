"""Save throughput and latency of the PostgresStore against the raw floor of the same server.

For 1, 8 and 32 runs saving at once (one asyncio task per run, each owning its
run through a lease), measures saves per second and p50 / p99 save latency of
``PostgresRun.save``: seal the state, one ``UPDATE ... WHERE token = ... AND
expires_at > now()`` in autocommit. Beside it, in the same process and pool
settings, the floor: a single-row ``UPDATE floor SET state = $1 WHERE id = $2``
commit with the same payload bytes and no serialization. Store and floor phases
alternate, twice each, so drift of the machine hits both.

Unless ``--dsn`` is given, a throwaway cluster is started (initdb/pg_ctl in a temp
dir, ``fsync=on``, as an unprivileged user when run as root) and removed after.

Run: ``.venv/bin/python benchmarks/postgres.py [--seconds 2] [--bytes 8000] [--dsn DSN]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from durably.postgres import PostgresRun, PostgresStore
from durably.state import AssistantMessage, RunState, ToolCall, ToolResult, Usage, UserMessage
from durably.stores._envelope import seal

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "stores"))
# The tests' throwaway-cluster helper: one way to start a server, for both.
from _pg_cluster import Cluster

CONCURRENCY = (1, 8, 32)


def build_state(run_id: str, approx_bytes: int) -> RunState:
    """A run whose conversation grows turn by turn to about ``approx_bytes`` of sealed JSON."""
    state = RunState(
        run_id=run_id,
        task="Find why test_checkout_flow is flaky and propose a fix",
        created_at=datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC),
        messages=[UserMessage(text="Find why test_checkout_flow is flaky and propose a fix")],
    )
    turn = 0
    while len(seal(state)) < approx_bytes:
        turn += 1
        path = f"services/checkout/handlers_{turn}.py"
        arguments = json.dumps({"path": path, "pattern": r"def .*\(.*timeout"})
        state.messages.append(
            AssistantMessage(
                text=f"Looking at {path} for timeout handling that races the payment callback.",
                calls=(ToolCall(id=f"toolu_{turn:04d}", name="grep", arguments=arguments),),
                usage=Usage(input_tokens=1800 + 40 * turn, output_tokens=90),
                turn=turn,
            )
        )
        lines = "".join(
            f"{path}:{n * 7}: async def wait(order_id, timeout={n}):\n" for n in range(4)
        )
        state.messages.append(ToolResult(call_id=f"toolu_{turn:04d}", name="grep", content=lines))
        state.turns = turn
    return state


def percentile(samples: list[float], q: int) -> float:
    """The q-th percentile of the samples."""
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1]


async def hammer(
    tasks: int, seconds: float, save: Callable[[int], Awaitable[None]]
) -> tuple[int, float, list[float]]:
    """``tasks`` loops calling ``save(i)`` for ``seconds``; return saves, elapsed, latencies."""
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds

    async def loop(index: int) -> None:
        while time.perf_counter() < stop_at:
            start = time.perf_counter()
            await save(index)
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(loop(i) for i in range(tasks)))
    return len(latencies), time.perf_counter() - start, latencies


async def measure(dsn: str, concurrency: int, seconds: float, size: int) -> dict[str, Any]:
    """Store and floor figures for one concurrency."""
    pool: AsyncConnectionPool[AsyncConnection[tuple[Any, ...]]] = AsyncConnectionPool(
        dsn,
        kwargs={"autocommit": True},
        min_size=concurrency + 2,
        max_size=concurrency + 2,
        open=False,
    )
    await pool.open(wait=True)
    results: dict[str, list[tuple[int, float, list[float]]]] = {"store": [], "floor": []}
    try:
        store = PostgresStore(pool=pool, lease=timedelta(seconds=60))
        states = [build_state(f"bench-{concurrency}-{i}", size) for i in range(concurrency)]
        handles: list[PostgresRun] = [await store.create(s) for s in states]
        payload = seal(states[0])
        async with pool.connection() as conn:
            await conn.execute("DROP TABLE IF EXISTS bench_floor")
            await conn.execute("CREATE TABLE bench_floor (id int PRIMARY KEY, state bytea)")
            await conn.execute(
                "INSERT INTO bench_floor SELECT g, %s FROM generate_series(0, %s) g",
                (payload, concurrency),
            )

        async def store_save(index: int) -> None:
            await handles[index].save(states[index])

        async def floor_save(index: int) -> None:
            async with pool.connection() as conn:
                await conn.execute(
                    "UPDATE bench_floor SET state = %s WHERE id = %s", (payload, index)
                )

        await hammer(concurrency, 0.3, store_save)  # warm up: connections, prepared plans
        await hammer(concurrency, 0.3, floor_save)
        for _ in range(2):
            results["store"].append(await hammer(concurrency, seconds / 2, store_save))
            results["floor"].append(await hammer(concurrency, seconds / 2, floor_save))
        for handle in handles:
            await handle.close()
    finally:
        await pool.close()

    figures: dict[str, Any] = {"concurrency": concurrency, "bytes": len(payload)}
    for name, rounds in results.items():
        count = sum(r[0] for r in rounds)
        elapsed = sum(r[1] for r in rounds)
        latencies = [x for r in rounds for x in r[2]]
        figures[name] = {
            "saves_per_s": count / elapsed,
            "p50_ms": percentile(latencies, 50) * 1000,
            "p99_ms": percentile(latencies, 99) * 1000,
            "n": count,
        }
    return figures


def print_table(rows: list[dict[str, Any]]) -> None:
    header = (
        f"{'runs':>4} | {'store/s':>8} {'p50 ms':>7} {'p99 ms':>7} | "
        f"{'floor/s':>8} {'p50 ms':>7} {'p99 ms':>7} | "
        f"{'rate':>5} {'p50':>5} {'p99':>5}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        s, f = row["store"], row["floor"]
        print(
            f"{row['concurrency']:>4} | {s['saves_per_s']:>8.0f} {s['p50_ms']:>7.2f} "
            f"{s['p99_ms']:>7.2f} | {f['saves_per_s']:>8.0f} {f['p50_ms']:>7.2f} "
            f"{f['p99_ms']:>7.2f} | {s['saves_per_s'] / f['saves_per_s']:>5.2f} "
            f"{s['p50_ms'] / f['p50_ms']:>5.2f} {s['p99_ms'] / f['p99_ms']:>5.2f}"
        )
    print()
    print("rate = store saves/s over floor saves/s; p50, p99 = store latency over floor latency")


async def run_all(dsn: str, seconds: float, size: int) -> list[dict[str, Any]]:
    return [await measure(dsn, c, seconds, size) for c in CONCURRENCY]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="use this server instead of a throwaway cluster")
    parser.add_argument("--seconds", type=float, default=2.0, help="per phase and concurrency")
    parser.add_argument("--bytes", type=int, default=8000, help="sealed state size")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args()
    cluster = None if args.dsn else Cluster.start()
    try:
        dsn = args.dsn or cluster.dsn  # type: ignore[union-attr]
        rows = asyncio.run(run_all(dsn, args.seconds, args.bytes))
    finally:
        if cluster is not None:
            cluster.stop()
    print(
        f"PostgresStore.save vs a raw single-row UPDATE commit of the same "
        f"{rows[0]['bytes']} bytes; {args.seconds:g}s per phase; fsync=on; "
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{platform.machine()}, local server over TCP loopback"
    )
    print()
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
