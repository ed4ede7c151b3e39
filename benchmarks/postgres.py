"""Save throughput and latency of the PostgresStore against the raw floor of the same server.

For 1, 8 and 32 runs saving at once (one asyncio task per run, each owning its
run through a lease), measures saves per second and p50 / p99 save latency of
``PostgresRun.save``, each save after the run took a step (one more message, as
the loop saves): encode the change, one statement conditional on the token and
the lease in autocommit (a whole snapshot when the changes outgrow the last one).
Beside it, in the same process and pool settings, the floor: a single-row
``UPDATE floor SET state = $1 WHERE id = $2`` commit of the runs' starting state
(``--bytes``) with no serialization, on a table with the server's defaults:
at least what a store writing whole states would send each save. Store and floor
phases alternate, twice each, so drift of the machine hits both. The store sends
saves that arrive while two of its save
statements are in flight together, in one statement (group commit), and its
state column is lz4-compressed (schema migration 2) where the server has lz4.

Informative columns, beside the target's: ``cpu us``, this process's CPU time per
save (``time.process_time``); ``grouped``, the share of the store's saves that
went in a statement with other runs' saves; ``lz4 rate``, the store's saves/s over
a third phase's, the same raw UPDATE on a table whose column is lz4 too (what the
store gains by group commit alone, not by compression).

The whole sweep is repeated (``--repeat``, default 3); the verdicts take the
median over repeats of the rate ratio at 1, 8 and 32 runs (target: >= 0.95 each).

In each repeat, after the sweep, the WAL of one run (``--wal-turns``, default 60):
a real :class:`durably.Agent` whose scripted model calls a keyed tool every turn,
each result ``--wal-tool-bytes`` (default 2,700) of incompressible text (base64
of a hash chain), about 160 KB over the run. The same run goes through a
``JournalStore`` (the bytes its directory holds after: the journal is append-only
below its compaction size, so that is what it wrote) and then the PostgresStore
(the server's ``pg_current_wal_lsn()`` moved over it; nothing else writes). The
verdict: the median over repeats of WAL over journal bytes (target: <= 2.0).

Then LangGraph (``--langgraph-bytes``, default 50 KB; skipped when
``langgraph-checkpoint-postgres`` is not installed): one run, one save at a
time, ``PostgresRun.save`` of a state of that size against LangGraph's
``PostgresSaver.put`` of a checkpoint holding the same messages as LangChain
messages (a new version of the ``messages`` channel each put, as a graph step
makes), the two alternating one call at a time on the same server. Before each
round every contender's conversation takes the same step (one more message), so
each saves a state that changed, and grows as a run does. The verdict
is the ratio of the medians (target: durably <= 0.5x). LangGraph's tables keep
the server's default compression (pglz); an informative third contender is
``PostgresRun.save`` on a state column set back to pglz (in a schema of its own),
which shows how much of durably's figure is lz4.

Unless ``--dsn`` is given, a throwaway cluster is started (initdb/pg_ctl in a temp
dir, ``fsync=on``, as an unprivileged user when run as root) and removed after.

Run: ``.venv/bin/python benchmarks/postgres.py [--seconds 2] [--bytes 8000]
[--repeat 3] [--wal-turns 60] [--langgraph-bytes 50000] [--langgraph-puts 200]
[--dsn DSN]``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import importlib.metadata
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

import durably
from durably import Agent, Call, Effect, Reply, ScriptedModel, ToolContext
from durably.checkpoint.envelope import seal
from durably.postgres import PostgresRun, PostgresStore
from durably.state import (
    AssistantMessage,
    Message,
    RunState,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
)
from durably.stores.journal import JournalStore

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # for _helpers
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "stores"))
# The tests' throwaway-cluster helper: one way to start a server, for both.
from _pg_cluster import Cluster
from _pgproc import postmaster_pid, server_cpu

HERE = Path(__file__).resolve().parent
CONCURRENCY = (1, 8, 32)
POSTMASTER: list[int] = []
"""The throwaway cluster's postmaster, whose CPU the phases read (none with ``--dsn``)."""
RATE_TARGET = 0.95
"""Store saves/s over floor saves/s at 32 runs: at least this."""
WAL_TARGET = 2.0
"""The PostgresStore's WAL for a run over the JournalStore's bytes for the same run: at most."""
LANGGRAPH_TARGET = 0.5
"""durably's median save over PostgresSaver.put's median: at most this."""


def build_state(run_id: str, approx_bytes: int) -> RunState:
    """A run whose conversation grows turn by turn to about ``approx_bytes`` of sealed JSON."""
    state = RunState(
        run_id=run_id,
        task="Find why test_checkout_flow is flaky and propose a fix",
        created_at=datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC),
        messages=[UserMessage(text="Find why test_checkout_flow is flaky and propose a fix")],
    )
    while len(seal(state)) < approx_bytes:
        state.messages.append(next_message(state))
        state.turns = len(state.messages) // 2
    return state


def next_message(state: RunState) -> Message:
    """The conversation's next message: a model reply calling grep, then grep's result."""
    turn = len(state.messages) // 2 + 1
    path = f"services/checkout/handlers_{turn}.py"
    if len(state.messages) % 2:
        arguments = json.dumps({"path": path, "pattern": r"def .*\(.*timeout"})
        return AssistantMessage(
            text=f"Looking at {path} for timeout handling that races the payment callback.",
            calls=(ToolCall(id=f"toolu_{turn:04d}", name="grep", arguments=arguments),),
            usage=Usage(input_tokens=1800 + 40 * turn, output_tokens=90),
            turn=turn,
        )
    lines = "".join(f"{path}:{n * 7}: async def wait(order_id, timeout={n}):\n" for n in range(4))
    return ToolResult(call_id=f"toolu_{turn - 1:04d}", name="grep", content=lines)


def percentile(samples: list[float], q: int) -> float:
    """The q-th percentile of the samples."""
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1]


async def hammer(
    tasks: int, seconds: float, save: Callable[[int], Awaitable[None]]
) -> tuple[int, float, list[float], float, float]:
    """``tasks`` loops calling ``save(i)`` for ``seconds``.

    Returns:
        saves, elapsed seconds, latencies, this process's CPU seconds, and the server's
        (0 when the server is not the benchmark's own).
    """
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds

    async def loop(index: int) -> None:
        while time.perf_counter() < stop_at:
            start = time.perf_counter()
            await save(index)
            latencies.append(time.perf_counter() - start)

    server = server_cpu(POSTMASTER[0]) if POSTMASTER else 0.0
    start, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(loop(i) for i in range(tasks)))
    return (
        len(latencies),
        time.perf_counter() - start,
        latencies,
        time.process_time() - cpu,
        (server_cpu(POSTMASTER[0]) - server) if POSTMASTER else 0.0,
    )


async def measure(  # noqa: C901 - one interleaved measurement loop, store and floor side by side
    dsn: str, concurrency: int, seconds: float, size: int, *, tag: int = 0
) -> dict[str, Any]:
    """Store and floor figures for one concurrency."""
    pool: AsyncConnectionPool[AsyncConnection[tuple[Any, ...]]] = AsyncConnectionPool(
        dsn,
        kwargs={"autocommit": True},
        min_size=concurrency + 2,
        max_size=concurrency + 2,
        open=False,
    )
    await pool.open(wait=True)
    results: dict[str, list[tuple[int, float, list[float], float, float]]] = {
        "store": [],
        "floor": [],
        "lz4floor": [],
    }
    grouped = 0
    try:
        store = PostgresStore(pool=pool, lease=timedelta(seconds=60))
        states = [build_state(f"bench-{tag}-{concurrency}-{i}", size) for i in range(concurrency)]
        handles: list[PostgresRun] = [await store.create(s) for s in states]
        payload = seal(states[0])
        lz4 = await server_has_lz4(pool)
        async with pool.connection() as conn:
            for table in ("bench_floor", "bench_floor_lz4"):
                await conn.execute(f"DROP TABLE IF EXISTS {table}")
                await conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, state bytea)")
                if table == "bench_floor_lz4" and lz4:
                    await conn.execute(
                        f"ALTER TABLE {table} ALTER COLUMN state SET COMPRESSION lz4"
                    )
                await conn.execute(
                    f"INSERT INTO {table} SELECT g, %s FROM generate_series(0, %s) g",  # noqa: S608 -- a name of ours
                    (payload, concurrency),
                )

        async def store_save(index: int) -> None:
            state = states[index]
            state.messages.append(next_message(state))  # a step of the run, as the loop saves
            await handles[index].save(state)

        async def floor_save(index: int) -> None:
            async with pool.connection() as conn:
                await conn.execute(
                    "UPDATE bench_floor SET state = %s WHERE id = %s", (payload, index)
                )

        async def lz4_floor_save(index: int) -> None:
            async with pool.connection() as conn:
                await conn.execute(
                    "UPDATE bench_floor_lz4 SET state = %s WHERE id = %s", (payload, index)
                )

        phases = {"store": store_save, "floor": floor_save}
        if lz4:
            phases["lz4floor"] = lz4_floor_save
        for save in phases.values():  # warm up: connections, prepared plans
            await hammer(concurrency, 0.3, save)
        # getattr: the benchmark also runs against a durably without group commit (A/B).
        grouped = -getattr(store.stats, "grouped", 0)
        for _ in range(2):
            for name, save in phases.items():
                results[name].append(await hammer(concurrency, seconds / 2, save))
        grouped += getattr(store.stats, "grouped", 0)
        for handle in handles:
            await handle.close()
    finally:
        await pool.close()

    figures: dict[str, Any] = {"concurrency": concurrency, "bytes": len(payload)}
    for name, rounds in results.items():
        if not rounds:
            figures[name] = None
            continue
        count = sum(r[0] for r in rounds)
        elapsed = sum(r[1] for r in rounds)
        latencies = [x for r in rounds for x in r[2]]
        figures[name] = {
            "saves_per_s": count / elapsed,
            "p50_ms": percentile(latencies, 50) * 1000,
            "p99_ms": percentile(latencies, 99) * 1000,
            "cpu_us": sum(r[3] for r in rounds) / count * 1e6,
            "srv_us": sum(r[4] for r in rounds) / count * 1e6,
            "n": count,
        }
    figures["store"]["grouped"] = grouped / figures["store"]["n"]
    return figures


async def server_has_lz4(pool: AsyncConnectionPool[AsyncConnection[tuple[Any, ...]]]) -> bool:
    """Whether the server can compress a column with lz4 (PostgreSQL 14+, built with it)."""
    async with pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
        )
        row = await cursor.fetchone()
    return bool(row and row[0])


def print_table(rows: list[dict[str, Any]]) -> None:
    """Print one row per concurrency: the store, the floor, their ratios, and more.

    The informative columns: CPU per save, the share of grouped saves, the rate over
    the lz4 floor.
    """
    header = (
        f"{'runs':>4} | {'store/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'cpu us':>6} | "
        f"{'floor/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'cpu us':>6} | "
        f"{'rate':>5} {'p50':>5} {'p99':>5} | {'grouped':>7} {'lz4 rate':>8} | "
        f"{'srv us':>6} {'floor':>6}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        s, f, z = row["store"], row["floor"], row["lz4floor"]
        lz4_rate = f"{s['saves_per_s'] / z['saves_per_s']:>8.2f}" if z else f"{'-':>8}"
        print(
            f"{row['concurrency']:>4} | {s['saves_per_s']:>8.0f} {s['p50_ms']:>7.2f} "
            f"{s['p99_ms']:>7.2f} {s['cpu_us']:>6.0f} | {f['saves_per_s']:>8.0f} "
            f"{f['p50_ms']:>7.2f} {f['p99_ms']:>7.2f} {f['cpu_us']:>6.0f} | "
            f"{s['saves_per_s'] / f['saves_per_s']:>5.2f} "
            f"{s['p50_ms'] / f['p50_ms']:>5.2f} {s['p99_ms'] / f['p99_ms']:>5.2f} | "
            f"{s['grouped']:>7.0%} {lz4_rate} | {s['srv_us']:>6.0f} {f['srv_us']:>6.0f}"
        )
    print()
    print(
        "rate = store saves/s over floor saves/s; p50, p99 = store latency over floor latency;\n"
        "cpu us = this process's CPU per save; grouped = store saves sent with other runs' "
        "saves;\nlz4 rate = store saves/s over the same raw UPDATE on an lz4 column "
        "(informative);\nsrv us = the server's CPU per save (its processes' utime + stime, "
        "from /proc), the store's and the floor's"
    )


async def run_all(dsn: str, seconds: float, size: int, *, tag: int = 0) -> list[dict[str, Any]]:
    """Store and floor figures at each concurrency (``tag`` keeps run IDs unique per repeat)."""
    return [await measure(dsn, c, seconds, size, tag=tag) for c in CONCURRENCY]


def wal_agent(store: Any, turns: int, tool_bytes: int) -> Agent:
    """A run of ``turns`` turns: a keyed tool every turn, ``tool_bytes`` of incompressible text."""

    @durably.tool(effect=Effect.KEYED, key_ttl=durably.NEVER_EXPIRES)
    async def fetch(ctx: ToolContext, page: int) -> str:
        """Fetch a page (keyed: the service deduplicates by the idempotency key)."""
        seed = hashlib.sha256(f"{ctx.idempotency_key}/{page}".encode()).digest()
        raw = b""
        while len(raw) < tool_bytes:
            seed = hashlib.sha256(seed).digest()
            raw += seed
        return base64.b64encode(raw).decode()[:tool_bytes]

    usage = durably.Usage(input_tokens=1800, output_tokens=90)
    replies = [
        Reply(calls=[Call(f"toolu_{n:04d}", "fetch", f'{{"page": {n}}}')], usage=usage)
        for n in range(1, turns)
    ]
    replies.append(Reply(text="the payment callback races the timeout; fix attached", usage=usage))
    return Agent(
        model=ScriptedModel(replies), tools=[fetch], store=store, system="You find flaky tests."
    )


async def measure_wal(dsn: str, turns: int, tool_bytes: int, *, tag: int) -> dict[str, Any]:
    """One run's bytes: the journal's files, then the server's WAL for the same run."""
    with tempfile.TemporaryDirectory(prefix="durably-bench-journal-") as directory:
        await wal_agent(JournalStore(directory), turns, tool_bytes).run(
            "Find why test_checkout_flow is flaky", run_id=f"wal-journal-{tag}"
        )
        journal = directory_bytes(Path(directory))
    async with PostgresStore(dsn, lease=timedelta(seconds=60)) as store:
        await store.migrate()
        start = await wal_lsn(dsn)
        outcome = await wal_agent(store, turns, tool_bytes).run(
            "Find why test_checkout_flow is flaky", run_id=f"wal-postgres-{tag}-{time.time_ns()}"
        )
        wal = await wal_lsn(dsn) - start
        saves, snapshots = store.stats.saves, store.stats.snapshots
    return {
        "journal_bytes": journal,
        "wal_bytes": wal,
        "ratio": wal / journal,
        "saves": saves,
        "snapshots": snapshots,
        "turns": outcome.turns,
    }


def directory_bytes(directory: Path) -> int:
    """The bytes of every file under ``directory``."""
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


async def wal_lsn(dsn: str) -> int:
    """The server's WAL position, in bytes."""
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")
        row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


def verdict(label: str, value: float, target: float, *, at_least: bool) -> None:
    """Print one figure against its target and whether the target is met."""
    met = value >= target if at_least else value <= target
    sign = ">=" if at_least else "<="
    print(f"{label:<52} {value:6.2f}  (target {sign} {target}: {'met' if met else 'NOT met'})")


# -- LangGraph's PostgresSaver ---------------------------------------------------------


def load_langgraph() -> tuple[dict[str, Any] | None, str]:
    """LangGraph's PostgresSaver and what it needs, or None and why not."""
    # This directory holds benchmarks/langgraph.py, which would shadow the langgraph package.
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
    try:
        from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
        from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint
        from langgraph.checkpoint.postgres import PostgresSaver
    except ImportError as exc:
        return None, (
            f"PostgresSaver skipped: {exc}; install it with "
            "`.venv/bin/pip install langgraph-checkpoint-postgres` (a benchmark-only dependency)"
        )
    finally:
        sys.path[:] = saved
    version = importlib.metadata.version("langgraph-checkpoint-postgres")
    names = {
        "AIMessage": AIMessage,
        "HumanMessage": HumanMessage,
        "ToolMessage": ToolMessage,
        "create_checkpoint": create_checkpoint,
        "empty_checkpoint": empty_checkpoint,
        "PostgresSaver": PostgresSaver,
    }
    return names, f"langgraph-checkpoint-postgres {version}"


def to_langchain(lg: dict[str, Any], message: Message) -> Any:
    """The LangChain message a LangGraph agent would hold for ``message``."""
    if isinstance(message, AssistantMessage):
        calls = [
            {"name": c.name, "args": json.loads(c.arguments), "id": c.id} for c in message.calls
        ]
        usage = message.usage
        return lg["AIMessage"](
            content=message.text or "",
            tool_calls=calls,
            usage_metadata={
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "total_tokens": usage.input_tokens + usage.output_tokens,
            },
        )
    if isinstance(message, ToolResult):
        return lg["ToolMessage"](
            content=message.content, tool_call_id=message.call_id, name=message.name
        )
    return lg["HumanMessage"](content=getattr(message, "text", ""))


class SaverThread:
    """One LangGraph thread checkpointed by ``PostgresSaver.put``, a graph step per put."""

    def __init__(self, lg: dict[str, Any], dsn: str, state: RunState) -> None:
        from psycopg import Connection
        from psycopg.rows import dict_row

        self.lg = lg
        # As PostgresSaver.from_conn_string opens it.
        self.conn = Connection.connect(
            dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row
        )
        self.saver = lg["PostgresSaver"](self.conn)
        self.saver.setup()
        self.config: dict[str, Any] = {"configurable": {"thread_id": "bench", "checkpoint_ns": ""}}
        self.messages = [to_langchain(lg, m) for m in state.messages]
        self.checkpoint = lg["empty_checkpoint"]()
        self.step = -1

    def add(self, message: Message) -> None:
        """A graph step's new message, in the messages channel."""
        self.messages = [*self.messages, to_langchain(self.lg, message)]

    def put(self) -> None:
        """Save the next step's checkpoint: a new version of the messages channel."""
        self.step += 1
        versions = self.checkpoint["channel_versions"]
        version = self.saver.get_next_version(versions.get("messages"), None)
        base = {
            **self.checkpoint,
            "channel_values": {"messages": self.messages},
            "channel_versions": {**versions, "messages": version},
        }
        self.checkpoint = self.lg["create_checkpoint"](base, None, self.step)
        metadata = {"source": "loop", "step": self.step}
        self.config = self.saver.put(self.config, self.checkpoint, metadata, {"messages": version})

    def close(self) -> None:
        """Close the saver's connection."""
        self.conn.close()


async def compare_langgraph(
    dsn: str, lg: dict[str, Any], size: int, puts: int
) -> tuple[dict[str, list[float]], tuple[int, int]]:
    """Latencies of each contender, taking turns one call at a time; the first and last size.

    The contenders: durably's save, PostgresSaver.put, and (informative, where the
    server has lz4) durably's save on a pglz state column.
    """
    from psycopg.conninfo import make_conninfo

    tag = time.time_ns()
    store = PostgresStore(dsn, lease=timedelta(seconds=60))
    # Each round adds a message: start below ``size`` by half the growth, so the median
    # round saves a state of about ``size``.
    sample = build_state("sample", size)
    per_message = len(seal(sample)) / len(sample.messages)
    state = build_state(f"bench-langgraph-{tag}", int(size - per_message * (puts + 10) / 2))
    first = len(seal(state))
    handle = await store.create(state)
    saves: dict[str, Callable[[], Awaitable[None]]] = {}
    grows: dict[str, Callable[[Message], None]] = {}
    saves["durably"] = lambda: handle.save(state)
    grows["durably"] = state.messages.append
    pglz_store: PostgresStore | None = None
    pglz_handle: PostgresRun | None = None
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
        )
        row = await cursor.fetchone()
        if row and row[0]:
            await conn.execute("CREATE SCHEMA IF NOT EXISTS bench_pglz")
            pglz_store = PostgresStore(
                make_conninfo(dsn, options="-c search_path=bench_pglz"),
                lease=timedelta(seconds=60),
            )
    if pglz_store is not None:
        await pglz_store.migrate()
        await pglz_store.execute(
            lambda conn: conn.execute(
                "ALTER TABLE durably_runs ALTER COLUMN state SET COMPRESSION pglz"
            ),
            what="setting pglz",
        )
        pglz_state = build_state(f"bench-langgraph-pglz-{tag}", size)
        pglz_handle = pglz = await pglz_store.create(pglz_state)
        saves["durably pglz"] = lambda: pglz.save(pglz_state)
        grows["durably pglz"] = pglz_state.messages.append
    thread = SaverThread(lg, dsn, state)
    grows["langgraph"] = thread.add

    async def put() -> None:
        thread.put()

    saves["langgraph"] = put
    times: dict[str, list[float]] = {name: [] for name in saves}
    order = list(saves)
    try:
        for n in range(puts + 10):  # the first 10 of each warm up, discarded
            message = next_message(state)  # every contender's conversation takes a step
            for which in order[n % len(order) :] + order[: n % len(order)]:
                grows[which](message)
                start = time.perf_counter()
                await saves[which]()
                elapsed = time.perf_counter() - start
                if n >= 10:
                    times[which].append(elapsed)
    finally:
        thread.close()
        await handle.close()
        await store.close()
        if pglz_handle is not None:
            await pglz_handle.close()
        if pglz_store is not None:
            await pglz_store.close()
    return times, (first, len(seal(state)))


def main() -> None:
    """Run the benchmark and print the table (``--help`` lists the options)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="use this server instead of a throwaway cluster")
    parser.add_argument("--seconds", type=float, default=2.0, help="per phase and concurrency")
    parser.add_argument("--bytes", type=int, default=8000, help="sealed state size")
    parser.add_argument("--repeat", type=int, default=3, help="repeats of the whole sweep")
    parser.add_argument(
        "--langgraph-bytes", type=int, default=50_000, help="state size for the LangGraph part"
    )
    parser.add_argument(
        "--langgraph-puts", type=int, default=200, help="timed saves of each in the LangGraph part"
    )
    parser.add_argument("--wal-turns", type=int, default=60, help="turns of the WAL run")
    parser.add_argument(
        "--wal-tool-bytes", type=int, default=2700, help="each tool result of the WAL run"
    )
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args()
    lg, note = load_langgraph()
    cluster = None if args.dsn else Cluster.start()
    repeats: list[list[dict[str, Any]]] = []
    wals: list[dict[str, Any]] = []
    compared = None
    try:
        dsn = args.dsn or cluster.dsn  # type: ignore[union-attr]
        if cluster is not None:
            POSTMASTER.append(postmaster_pid(cluster.data))
        for number in range(args.repeat):
            repeats.append(asyncio.run(run_all(dsn, args.seconds, args.bytes, tag=number)))
            wals.append(
                asyncio.run(measure_wal(dsn, args.wal_turns, args.wal_tool_bytes, tag=number))
            )
        if lg is not None:
            compared = asyncio.run(
                compare_langgraph(dsn, lg, args.langgraph_bytes, args.langgraph_puts)
            )
    finally:
        if cluster is not None:
            cluster.stop()
    print(
        f"PostgresStore.save vs a raw single-row UPDATE commit of the same "
        f"{repeats[0][0]['bytes']} bytes; {args.seconds:g}s per phase; fsync=on; "
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{platform.machine()}, local server over TCP loopback"
    )
    for number, rows in enumerate(repeats, start=1):
        print()
        print(f"repeat {number} of {len(repeats)}:")
        print_table(rows)
    print()
    for index, concurrency in enumerate(CONCURRENCY):
        ratios = [
            r[index]["store"]["saves_per_s"] / r[index]["floor"]["saves_per_s"] for r in repeats
        ]
        label = f"rate at {concurrency} runs, median of {len(ratios)} repeats"
        verdict(label, statistics.median(ratios), RATE_TARGET, at_least=True)
    lz4_ratios = [
        r[-1]["store"]["saves_per_s"] / r[-1]["lz4floor"]["saves_per_s"]
        for r in repeats
        if r[-1]["lz4floor"]
    ]
    if lz4_ratios:
        label = f"informative: rate at {CONCURRENCY[-1]} runs over the lz4 floor"
        print(f"{label:<52} {statistics.median(lz4_ratios):6.2f}")
    print()
    for number, wal in enumerate(wals, start=1):
        print(
            f"WAL run, repeat {number}: {wal['turns']} turns, journal {wal['journal_bytes']:,} B, "
            f"WAL {wal['wal_bytes']:,} B ({wal['ratio']:.2f}x); {wal['saves']} saves, "
            f"{wal['snapshots']} of them snapshots"
        )
    verdict(
        f"WAL over journal bytes, median of {len(wals)} repeats",
        statistics.median(w["ratio"] for w in wals),
        WAL_TARGET,
        at_least=False,
    )
    print()
    if compared is None:
        print(note)
    else:
        times, sealed = compared
        durably_med = statistics.median(times["durably"])
        langgraph_med = statistics.median(times["langgraph"])
        print(
            f"one run, one save at a time, a message more each round, from {sealed[0]} to "
            f"{sealed[1]} sealed bytes ({note}; {len(times['durably'])} timed saves of each, "
            "taking turns):"
        )
        print(f"  PostgresRun.save      median {durably_med * 1000:7.3f} ms")
        print(f"  PostgresSaver.put     median {langgraph_med * 1000:7.3f} ms")
        if "durably pglz" in times:
            pglz_med = statistics.median(times["durably pglz"])
            print(
                f"  PostgresRun.save      median {pglz_med * 1000:7.3f} ms  on a pglz state "
                f"column (informative: {pglz_med / langgraph_med:.2f} of PostgresSaver.put)"
            )
        verdict(
            "durably median / PostgresSaver.put median",
            durably_med / langgraph_med,
            LANGGRAPH_TARGET,
            at_least=False,
        )
    if args.json:
        args.json.write_text(json.dumps({"rates": repeats, "wal": wals}, indent=2) + "\n")


if __name__ == "__main__":
    main()
