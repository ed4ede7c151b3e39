"""Checkpoint cost of one LangGraph agent run: DurablySaver vs SqliteSaver vs PostgresSaver.

The graph is the tool-calling agent of ``tests/langgraph/_lg_agent.py`` on a
scripted chat model: ``--rounds`` rounds of a reply calling a tool and a tool
result of about 1 KB (2 supersteps a round; 100 rounds make a 200-step run),
with ``durability="sync"``. The three savers run the same graph interleaved: one
``graph.stream`` per saver, advanced one superstep at a time in rotating order,
each advance waiting until its saver's calls have returned.

Per step, the latency is the time spent inside the saver's ``put_writes`` calls
of the step plus its ``put`` (timed around the calls, in the thread LangGraph
calls them from); the bytes are what those calls passed to ``write()`` (the
calling thread's ``wchar`` in ``/proc/thread-self/io``). PostgresSaver's bytes are
the server's: the WAL it generated over the run (``pg_current_wal_lsn``), as
its client only sends the rows.

- DurablySaver: ``DurablySaver(dir)``, fsync on (one ``fdatasync`` per call).
- SqliteSaver: ``sqlite3.connect(path, check_same_thread=False)`` as LangGraph's
  docs do, WAL (SqliteSaver sets it) and ``synchronous=FULL`` (a commit syncs the WAL).
- PostgresSaver: ``PostgresSaver.from_conn_string(dsn)`` on a throwaway cluster
  (``tests/stores/_pg_cluster.py``, ``fsync=on``) over TCP loopback, or ``--dsn``.
- append floor: what the disk alone costs for DurablySaver's writes: after each
  of its turns, each of its calls is replayed as one bare append of the same size
  and one ``fdatasync``.

Run: ``.venv/bin/python benchmarks/langgraph.py [--rounds 100] [--dsn DSN] [--no-postgres]``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this file's directory comes first on sys.path and the file itself
# would be imported as `langgraph`: take the directory out before importing LangGraph.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks"]
sys.path.insert(0, str(ROOT / "tests" / "langgraph"))
sys.path.insert(0, str(ROOT / "tests" / "stores"))

from _lg_agent import build, question  # noqa: E402
from _pg_cluster import Cluster  # noqa: E402
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402

from durably._sysio import filesystem_type  # noqa: E402
from durably.langgraph import DurablySaver  # noqa: E402

TARGETS = {"median": 0.3, "p99": 0.1, "bytes": 0.05}
"""DurablySaver / SqliteSaver ratios the issue asks for (at most)."""


def wchar() -> int:
    """Bytes the calling thread has passed to write() so far."""
    with open("/proc/thread-self/io", "rb") as io:
        for line in io:
            if line.startswith(b"wchar:"):
                return int(line.split()[1])
    raise RuntimeError("no wchar in /proc/thread-self/io")


class Timed:
    """Mixed into a saver class: times its put and put_writes, counts their write() bytes."""

    def timed_init(self) -> None:
        """Start the timing records (a mixin has no ``__init__`` of its own to do it)."""
        self.calls: list[tuple[str, float, int]] = []
        self.in_flight = 0
        self.guard = threading.Lock()

    def _timed(self, kind: str, call: Any, *args: Any) -> Any:
        with self.guard:
            self.in_flight += 1
        written = wchar()
        start = time.perf_counter()
        try:
            return call(*args)
        finally:
            elapsed = time.perf_counter() - start
            self.calls.append((kind, elapsed, wchar() - written))
            with self.guard:
                self.in_flight -= 1

    def put(self, *args: Any) -> Any:
        """The saver's ``put``, timed."""
        return self._timed("put", super().put, *args)  # type: ignore[misc]

    def put_writes(self, *args: Any) -> Any:
        """The saver's ``put_writes``, timed."""
        return self._timed("writes", super().put_writes, *args)  # type: ignore[misc]

    def steps(self) -> list[tuple[float, int]]:
        """(seconds, bytes) per step: the step's put_writes calls and its put."""
        out, seconds, written = [], 0.0, 0
        for kind, elapsed, count in self.calls:
            seconds += elapsed
            written += count
            if kind == "put":
                out.append((seconds, written))
                seconds, written = 0.0, 0
        return out


class Floor:
    """The disk's floor: DurablySaver's writes as bare appends and fdatasyncs, nothing else.

    After each of DurablySaver's turns, its new calls are replayed here (one
    append and one ``fdatasync`` per call, of the same size) and timed the same way.
    """

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.calls: list[tuple[str, float, int]] = []
        self.in_flight = 0
        self.seen = 0

    def follow(self, durable: Timed) -> None:
        """Replay the calls DurablySaver made since the last time."""
        for kind, _, count in durable.calls[self.seen :]:
            data = b"\0" * count
            start = time.perf_counter()
            os.write(self.fd, data)
            os.fdatasync(self.fd)
            self.calls.append((kind, time.perf_counter() - start, count))
        self.seen = len(durable.calls)

    steps = Timed.steps

    def close(self) -> None:
        """Close the floor's file."""
        os.close(self.fd)


def timed(cls: type) -> Any:
    """A subclass of a saver class with :class:`Timed` mixed in (built at run time: ``Any``)."""
    return type(f"Timed{cls.__name__}", (Timed, cls), {})


def p99(values: list[float]) -> float:
    """The 99th percentile (inclusive method)."""
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def drive(savers: dict[str, Any], rounds: int, floor: Floor) -> None:
    """Run the agent once per saver, one superstep at a time, rotating who goes first."""
    streams: dict[str, Iterator[Any]] = {}
    for name, saver in savers.items():
        config = {"configurable": {"thread_id": f"bench-{name}"}, "recursion_limit": 10_000}
        graph = build(saver, rounds=rounds)
        streams[name] = iter(graph.stream(question(), config, durability="sync"))
    order = list(streams)
    turn = 0
    while streams:
        rotated = order[turn % len(order) :] + order[: turn % len(order)]
        for name in rotated:
            if name not in streams:
                continue
            try:
                next(streams[name])
            except StopIteration:
                del streams[name]
            while savers[name].in_flight:  # a put still running in LangGraph's thread
                time.sleep(0.0002)
            if name == "DurablySaver":
                floor.follow(savers[name])
        turn += 1
        order = [name for name in order if name in streams] or order


def main() -> None:
    """Run the benchmark and print the table (``--help`` lists the options)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100, help="tool rounds (2 steps each)")
    parser.add_argument("--dir", type=Path, help="where the files go (a temp dir by default)")
    parser.add_argument("--dsn", help="use this PostgreSQL server instead of a throwaway cluster")
    parser.add_argument("--no-postgres", action="store_true", help="skip PostgresSaver")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="durably-lg-bench-", dir=args.dir))
    cluster = None
    postgres_cm = None
    savers: dict[str, Any] = {}
    try:
        durable = timed(DurablySaver)(base / "durably")
        durable.timed_init()
        savers["DurablySaver"] = durable
        conn = sqlite3.connect(base / "checkpoints.sqlite", check_same_thread=False)
        sqlite = timed(SqliteSaver)(conn)
        sqlite.timed_init()
        sqlite.setup()
        conn.execute("PRAGMA synchronous=FULL")
        savers["SqliteSaver"] = sqlite
        wal_start = 0
        if not args.no_postgres:
            from langgraph.checkpoint.postgres import PostgresSaver

            if args.dsn is None:
                cluster = Cluster.start()
            dsn = args.dsn or cluster.dsn  # type: ignore[union-attr]
            postgres_cm = timed(PostgresSaver).from_conn_string(dsn)
            postgres = postgres_cm.__enter__()
            postgres.timed_init()
            postgres.setup()
            savers["PostgresSaver"] = postgres
            with postgres.conn.cursor() as cur:
                wal_start = _wal_lsn(cur)
        floor = Floor(base / "floor.log")
        started = time.perf_counter()
        drive(savers, args.rounds, floor)
        wall = time.perf_counter() - started
        floor.close()
        savers["append floor"] = floor
        rows: dict[str, dict[str, Any]] = {}
        for name, saver in savers.items():
            steps = saver.steps()
            latencies = [s for s, _ in steps]
            puts = [e for kind, e, _ in saver.calls if kind == "put"] or [0.0]
            rows[name] = {
                "steps": len(steps),
                "median_ms": statistics.median(latencies) * 1e3,
                "p99_ms": p99(latencies) * 1e3,
                "put_median_ms": statistics.median(puts) * 1e3,
                "bytes": sum(b for _, b in steps),
            }
        if "PostgresSaver" in savers:
            with savers["PostgresSaver"].conn.cursor() as cur:
                rows["PostgresSaver"]["client_bytes"] = rows["PostgresSaver"]["bytes"]
                rows["PostgresSaver"]["bytes"] = _wal_lsn(cur) - wal_start
        sizes = {
            "DurablySaver": sum(p.stat().st_size for p in (base / "durably").iterdir()),
            "SqliteSaver": sum(p.stat().st_size for p in base.glob("checkpoints.sqlite*")),
        }
    finally:
        if postgres_cm is not None:
            postgres_cm.__exit__(None, None, None)
        if cluster is not None:
            cluster.stop()
        for saver in savers.values():
            if isinstance(saver, DurablySaver):
                saver.close()
    report(rows, sizes, args.rounds, wall, base)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "sizes": sizes}, indent=2))


def _wal_lsn(cur: Any) -> int:
    cur.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS lsn")
    row = cur.fetchone()
    return int(row["lsn"] if isinstance(row, dict) else row[0])


def report(
    rows: dict[str, dict[str, Any]], sizes: dict[str, int], rounds: int, wall: float, base: Path
) -> None:
    """Print the table and the ratios against SqliteSaver."""
    versions = ", ".join(
        f"{p} {importlib.metadata.version(p)}"
        for p in (
            "langgraph",
            "langgraph-checkpoint",
            "langgraph-checkpoint-sqlite",
            "langgraph-checkpoint-postgres",
        )
    )
    print(
        f"LangGraph agent, {rounds} tool rounds ({rows['DurablySaver']['steps']} checkpoints), "
        f'durability="sync", interleaved; {wall:.1f} s in all'
    )
    print(
        f"{platform.python_implementation()} {platform.python_version()}, {platform.machine()}, "
        f"{versions}, SQLite {sqlite3.sqlite_version}; files on {filesystem_type(base)}"
    )
    print()
    print(
        f"{'saver':<14} {'steps':>5} {'median ms':>10} {'p99 ms':>8} {'put med ms':>10} "
        f"{'bytes written':>14} {'on disk':>10}"
    )
    for name, row in rows.items():
        disk = sizes.get(name)
        print(
            f"{name:<14} {row['steps']:>5} {row['median_ms']:>10.3f} {row['p99_ms']:>8.3f} "
            f"{row['put_median_ms']:>10.3f} {row['bytes']:>14,} "
            f"{disk if disk is not None else '-':>10}"
        )
    if "PostgresSaver" in rows:
        print(
            "PostgresSaver bytes: the WAL the server generated (its client sends with "
            f"send(), which wchar does not count: {rows['PostgresSaver']['client_bytes']:,})"
        )
    print(
        "append floor: DurablySaver's calls replayed as bare appends of the same sizes, "
        "one fdatasync each, right after each of its turns"
    )
    print()
    durable, sqlite = rows["DurablySaver"], rows["SqliteSaver"]
    ratios = {
        "median": durable["median_ms"] / sqlite["median_ms"],
        "p99": durable["p99_ms"] / sqlite["p99_ms"],
        "bytes": durable["bytes"] / sqlite["bytes"],
    }
    for key, ratio in ratios.items():
        verdict = "met" if ratio <= TARGETS[key] else "NOT met"
        target = TARGETS[key]
        print(
            f"DurablySaver / SqliteSaver {key:<6}: {ratio:7.3f}x (target <= {target}x: {verdict})"
        )
    floor = rows["append floor"]
    print(
        f"DurablySaver / append floor median {durable['median_ms'] / floor['median_ms']:.3f}x, "
        f"p99 {durable['p99_ms'] / floor['p99_ms']:.3f}x; "
        f"append floor / SqliteSaver median {floor['median_ms'] / sqlite['median_ms']:.3f}x, "
        f"p99 {floor['p99_ms'] / sqlite['p99_ms']:.3f}x"
    )
    if "PostgresSaver" in rows:
        pg = rows["PostgresSaver"]
        median = durable["median_ms"] / pg["median_ms"]
        tail = durable["p99_ms"] / pg["p99_ms"]
        written = durable["bytes"] / pg["bytes"]
        print(
            f"DurablySaver / PostgresSaver median {median:.3f}x, p99 {tail:.3f}x, "
            f"bytes {written:.3f}x"
        )


if __name__ == "__main__":
    main()
