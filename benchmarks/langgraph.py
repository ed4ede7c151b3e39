"""Checkpoint cost of one LangGraph agent run: DurablySaver vs SqliteSaver, and on Postgres.

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
- PgThreadSaver: durably's ``PostgresThreadSaver(dsn)`` on the same server, against
  PostgresSaver (targets: median step <= 0.5x, bytes <= 0.05x). Each Postgres saver's
  bytes are the WAL the server generated during its own turns of the rotation (only
  one saver runs at a time), read from ``pg_current_wal_lsn`` on a connection of its own.
- floors: what the disk alone costs for DurablySaver's writes: after each of its
  turns, each of its calls is replayed as one write of the same size on a bare
  file, as an append + ``fdatasync`` (``append floor``, the saver's old append)
  and as an ``O_DSYNC`` write into reserved space (``reserved floor``, its append now).
- in-graph floors (:class:`InGraphFloor`): savers run in their own graph in the
  same rotation, whose calls each do one ``O_DSYNC`` write of DurablySaver's
  size and nothing else, on a file per kind (``in-graph floor``) or serially on
  one (``serial floor``): the lowest per-step latency a durable saver can have
  inside LangGraph here. DurablySaver's median and p99 step over the in-graph
  floor's, in the same run (the rotation interleaves them step by step), have
  targets too (issue 35: <= 1.2x each).

The whole comparison runs ``--repeat`` times (5 by default), each time on fresh
files; each run's ratios are printed, and the verdict is on the median of each
ratio over the runs, since one run on a shared machine can catch a burst of
someone else's disk traffic.

Run: ``.venv/bin/python benchmarks/langgraph.py [--repeat 5] [--rounds 100] [--dsn DSN]
[--no-postgres]``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
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
sys.path.insert(0, str(ROOT / "tests"))  # _pg_cluster imports _helpers from there
sys.path.insert(0, str(ROOT / "tests" / "langgraph"))
sys.path.insert(0, str(ROOT / "tests" / "stores"))

from _lg_agent import build, question  # noqa: E402
from _pg_cluster import Cluster  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402

from durably._sysio import filesystem_type  # noqa: E402
from durably.langgraph import DurablySaver, PostgresThreadSaver  # noqa: E402

TARGETS = {"median": 0.3, "p99": 0.1, "bytes": 0.05}
"""DurablySaver / SqliteSaver ratios the issue asks for (at most)."""

FLOOR_TARGETS = {"median": 1.2, "p99": 1.2}
"""DurablySaver / in-graph floor ratios asked for (at most; issue 35 item 5), same run."""

PG_TARGETS = {"median": 0.5, "bytes": 0.05}
"""PgThreadSaver (durably's PostgresThreadSaver) / PostgresSaver ratios asked for (at most)."""
POSTGRES_SAVERS = ("PostgresSaver", "PgThreadSaver")


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
        self.spans: list[tuple[float, float]] = []
        """(start, end) of each call, in the order of ``calls``."""
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
            end = time.perf_counter()
            self.calls.append((kind, end - start, wchar() - written))
            self.spans.append((start, end))
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

    def in_flight_per_step(self) -> list[float]:
        """Per step, the time at least one of its calls was running (overlaps counted once).

        A put that waits for the step's put_writes to finish its flush is counted
        in full by :meth:`steps`; here that wait is counted once.
        """
        out: list[float] = []
        group: list[tuple[float, float]] = []
        for (kind, _, _), span in zip(self.calls, self.spans, strict=True):
            group.append(span)
            if kind == "put":
                total, reach = 0.0, float("-inf")
                for start, end in sorted(group):
                    if end > reach:
                        total += end - max(start, reach)
                        reach = end
                out.append(total)
                group = []
        return out


class Floor:
    """The disk's floor: DurablySaver's writes replayed on a bare file, nothing else.

    After each of DurablySaver's turns, its new calls are replayed here (one
    write of the same size per call) and timed the same way. Two ways:

    - ``append``: ``write`` at the end of a growing file, then ``fdatasync`` (what
      the saver did before issue 20's latency work);
    - ``reserved``: one ``write`` through ``O_DSYNC`` into space reserved ahead
      with ``posix_fallocate`` as the saver reserves it (what it does now).
    """

    def __init__(self, path: Path, *, reserved: bool) -> None:
        flags = os.O_WRONLY | os.O_CREAT | (os.O_DSYNC if reserved else os.O_APPEND)
        self.fd = os.open(path, flags, 0o600)
        self.reserved = reserved
        self.size = self.allocated = 0
        self.calls: list[tuple[str, float, int]] = []
        self.in_flight = 0
        self.seen = 0

    def follow(self, durable: Timed) -> None:
        """Replay the calls DurablySaver made since the last time."""
        for kind, _, count in durable.calls[self.seen :]:
            data = b"\1" * count
            start = time.perf_counter()
            if self.reserved:
                end = self.size + count
                if end > self.allocated:
                    self.allocated = end + min(max(end, 256 << 10), 8 << 20)
                    os.posix_fallocate(self.fd, self.size, self.allocated - self.size)
                os.write(self.fd, data)
                self.size = end
            else:
                os.write(self.fd, data)
                os.fdatasync(self.fd)
            self.calls.append((kind, time.perf_counter() - start, count))
        self.seen = len(durable.calls)

    steps = Timed.steps

    def close(self) -> None:
        """Close the floor's file."""
        os.close(self.fd)


class InGraphFloor(InMemorySaver):
    """The lowest per-step cost a durable saver can have inside LangGraph: one write per call.

    Run in its own graph beside the real savers, its ``put`` and ``put_writes``
    each do exactly one ``O_DSYNC`` write, into space reserved ahead, of as many
    bytes as DurablySaver's call of the same kind and rank wrote (``sizes``,
    recorded beforehand), and nothing else: no encoding, no index, no state
    stored (the graph never reads a checkpoint back during a run). What is left
    is the disk's time and LangGraph's own threads around the calls.

    ``serial=False``: puts and put_writes write to a file each, at once, so a
    ``put`` does not wait for the step's ``put_writes`` to finish (as a checkpoint
    log and a writes log would allow). ``serial=True``: a lock is
    held across each write, as one log needs (a put waits for the step's
    ``put_writes``), which is what DurablySaver does.
    """

    def __init__(self, path: Path, sizes: dict[str, list[int]], *, serial: bool) -> None:
        super().__init__()
        self.sizes = sizes
        self.fds: dict[str, int] = {}
        # Serial: one file for both kinds. Not serial: a file per kind, as two logs would be.
        for kind in ("put",) if serial else ("put", "writes"):
            name = path if serial else path.with_suffix(f".{kind}.log")
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_DSYNC, 0o600)
            os.posix_fallocate(fd, 0, 2 * sum(sum(each) for each in sizes.values()) + (1 << 20))
            self.fds[kind] = fd
        self.fds.setdefault("writes", self.fds["put"])
        self.payload = memoryview(b"\1" * max(max(each, default=1) for each in sizes.values()))
        self.counts = {"put": 0, "writes": 0}
        self.ends = dict.fromkeys(self.fds.values(), 0)
        self.offsets = threading.Lock()
        self.serial = threading.Lock() if serial else None

    def _write(self, kind: str) -> None:
        with self.offsets:
            rank = self.counts[kind]
            self.counts[kind] += 1
            sizes = self.sizes[kind]
            size = sizes[min(rank, len(sizes) - 1)]
            fd = self.fds[kind]
            offset = self.ends[fd]
            self.ends[fd] += size
        if self.serial is not None:
            with self.serial:
                os.pwrite(fd, self.payload[:size], offset)
        else:
            os.pwrite(fd, self.payload[:size], offset)

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        """One durable write; the config LangGraph expects back."""
        self._write("put")
        configurable = config["configurable"]
        return {
            "configurable": {
                "thread_id": configurable["thread_id"],
                "checkpoint_ns": configurable.get("checkpoint_ns", ""),
                "checkpoint_id": checkpoint["id"],
            }
        }

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        """One durable write."""
        self._write("writes")

    def close(self) -> None:
        """Close the floor's files."""
        for fd in set(self.fds.values()):
            os.close(fd)


def call_sizes(base: Path, rounds: int) -> dict[str, list[int]]:
    """The bytes DurablySaver writes in each put and put_writes of one run, in order."""
    saver = timed(DurablySaver)(base, sync=False)
    saver.timed_init()
    try:
        config = {"configurable": {"thread_id": "sizes"}, "recursion_limit": 10_000}
        for _ in build(saver, rounds=rounds).stream(question(), config, durability="sync"):
            pass
    finally:
        saver.close()
    sizes: dict[str, list[int]] = {"put": [], "writes": []}
    for kind, _, count in saver.calls:
        sizes[kind].append(count)
    return sizes


def timed(cls: type) -> Any:
    """A subclass of a saver class with :class:`Timed` mixed in (built at run time: ``Any``)."""
    return type(f"Timed{cls.__name__}", (Timed, cls), {})


def p99(values: list[float]) -> float:
    """The 99th percentile (inclusive method)."""
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def drive(
    savers: dict[str, Any],
    rounds: int,
    floors: list[Floor],
    *,
    tag: int,
    wal: Any = None,
    wal_bytes: dict[str, int] | None = None,
) -> None:
    """Run the agent once per saver, one superstep at a time, rotating who goes first.

    With ``wal`` (a function reading the server's WAL position), the WAL each Postgres
    saver's turns generate is added up in ``wal_bytes``.
    """
    streams: dict[str, Iterator[Any]] = {}
    for name, saver in savers.items():
        thread_id = f"bench-{name.replace(' ', '-')}-{tag}"  # a reused Postgres keeps its threads
        config = {"configurable": {"thread_id": thread_id}, "recursion_limit": 10_000}
        graph = build(saver, rounds=rounds)
        streams[name] = iter(graph.stream(question(), config, durability="sync"))
    order = list(streams)
    turn = 0
    while streams:
        rotated = order[turn % len(order) :] + order[: turn % len(order)]
        for name in rotated:
            if name not in streams:
                continue
            measured = wal is not None and wal_bytes is not None and name in POSTGRES_SAVERS
            before = wal() if measured else 0
            try:
                next(streams[name])
            except StopIteration:
                del streams[name]
            while savers[name].in_flight:  # a put still running in LangGraph's thread
                time.sleep(0.0002)
            if measured and wal_bytes is not None:
                wal_bytes[name] = wal_bytes.get(name, 0) + wal() - before
            if name == "DurablySaver":  # the floors take turns going first, too
                for floor in floors if turn % 2 == 0 else floors[::-1]:
                    floor.follow(savers[name])
        turn += 1
        order = [name for name in order if name in streams] or order


def run_once(
    base: Path, rounds: int, dsn: str | None, tag: int, call_bytes: dict[str, list[int]]
) -> tuple[dict[str, dict[str, Any]], dict[str, int], float]:
    """One interleaved run of every saver: (rows by saver, bytes on disk, wall seconds)."""
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
        for name, serial in (("in-graph floor", False), ("serial floor", True)):
            floor_saver = timed(InGraphFloor)(base / f"{name[:-6]}.log", call_bytes, serial=serial)
            floor_saver.timed_init()
            savers[name] = floor_saver
        wal_conn = None
        wal_bytes: dict[str, int] = {}
        if dsn is not None:
            from langgraph.checkpoint.postgres import PostgresSaver

            postgres_cm = timed(PostgresSaver).from_conn_string(dsn)
            postgres = postgres_cm.__enter__()
            postgres.timed_init()
            postgres.setup()
            savers["PostgresSaver"] = postgres
            thread_saver = timed(PostgresThreadSaver)(dsn)
            thread_saver.timed_init()
            thread_saver.setup()
            savers["PgThreadSaver"] = thread_saver
            import psycopg

            wal_conn = psycopg.connect(dsn, autocommit=True)
        floors = {
            "append floor": Floor(base / "append-floor.log", reserved=False),
            "reserved floor": Floor(base / "reserved-floor.log", reserved=True),
        }
        started = time.perf_counter()
        wal_cur = wal_conn.cursor() if wal_conn is not None else None
        drive(
            savers,
            rounds,
            list(floors.values()),
            tag=tag,
            wal=(lambda: _wal_lsn(wal_cur)) if wal_cur is not None else None,
            wal_bytes=wal_bytes,
        )
        wall = time.perf_counter() - started
        for name, floor in floors.items():
            floor.close()
            savers[name] = floor
        rows: dict[str, dict[str, Any]] = {}
        for name, saver in savers.items():
            steps = saver.steps()
            latencies = [s for s, _ in steps]
            puts = [e for kind, e, _ in saver.calls if kind == "put"] or [0.0]
            flight = saver.in_flight_per_step() if isinstance(saver, Timed) else latencies
            rows[name] = {
                "steps": len(steps),
                "in_flight_median_ms": statistics.median(flight) * 1e3,
                "median_ms": statistics.median(latencies) * 1e3,
                "p99_ms": p99(latencies) * 1e3,
                "put_median_ms": statistics.median(puts) * 1e3,
                "bytes": sum(b for _, b in steps),
            }
        for name in POSTGRES_SAVERS:
            if name in rows:
                rows[name]["client_bytes"] = rows[name]["bytes"]
                rows[name]["bytes"] = wal_bytes.get(name, 0)
        if wal_conn is not None:
            wal_conn.close()
        conn.close()
    finally:
        if postgres_cm is not None:
            postgres_cm.__exit__(None, None, None)
        for saver in savers.values():
            if isinstance(saver, DurablySaver | InGraphFloor | PostgresThreadSaver):
                saver.close()
    # After close: a saver that preallocates its log gives back what it did not use.
    sizes = {
        "DurablySaver": sum(p.stat().st_size for p in (base / "durably").iterdir()),
        "SqliteSaver": sum(p.stat().st_size for p in base.glob("checkpoints.sqlite*")),
    }
    return rows, sizes, wall


def main() -> None:
    """Run the benchmark, print the table, the ratios and whether the targets are met."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100, help="tool rounds (2 steps each)")
    parser.add_argument(
        "--repeat", type=int, default=5, help="runs; the verdict is on the median ratio"
    )
    parser.add_argument("--dir", type=Path, help="where the files go (a temp dir by default)")
    parser.add_argument("--dsn", help="use this PostgreSQL server instead of a throwaway cluster")
    parser.add_argument("--no-postgres", action="store_true", help="skip PostgresSaver")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")

    top = Path(tempfile.mkdtemp(prefix="durably-lg-bench-", dir=args.dir))
    cluster = None
    runs: list[dict[str, Any]] = []
    try:
        dsn = args.dsn
        if not args.no_postgres and dsn is None:
            cluster = Cluster.start()
            dsn = cluster.dsn
        if args.no_postgres:
            dsn = None
        call_bytes = call_sizes(top / "sizes", args.rounds)
        for number in range(1, args.repeat + 1):
            base = top / f"run{number}"
            base.mkdir()
            rows, sizes, wall = run_once(base, args.rounds, dsn, number, call_bytes)
            runs.append({"rows": rows, "sizes": sizes, "wall": wall, "ratios": ratios(rows)})
            print(f"run {number}/{args.repeat}: " + format_ratios(runs[-1]["ratios"]), flush=True)
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(top, ignore_errors=True)
    print()
    report(runs, args.rounds, filesystem_type(top.parent))
    if args.json:
        args.json.write_text(json.dumps({"runs": runs}, indent=2))


def _wal_lsn(cur: Any) -> int:
    cur.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS lsn")
    row = cur.fetchone()
    return int(row["lsn"] if isinstance(row, dict) else row[0])


def ratios(rows: dict[str, dict[str, Any]]) -> dict[str, float]:
    """DurablySaver's figures over SqliteSaver's (the targets), and over the floor's."""
    durable, sqlite, floor = rows["DurablySaver"], rows["SqliteSaver"], rows["reserved floor"]
    out = {
        "median": durable["median_ms"] / sqlite["median_ms"],
        "p99": durable["p99_ms"] / sqlite["p99_ms"],
        "bytes": durable["bytes"] / sqlite["bytes"],
        "in-graph median": durable["median_ms"] / rows["in-graph floor"]["median_ms"],
        "in-graph p99": durable["p99_ms"] / rows["in-graph floor"]["p99_ms"],
        "floor median": durable["median_ms"] / floor["median_ms"],
        "floor p99": durable["p99_ms"] / floor["p99_ms"],
        "append floor median": rows["append floor"]["median_ms"] / sqlite["median_ms"],
        "append floor p99": rows["append floor"]["p99_ms"] / sqlite["p99_ms"],
        "reserved floor median": floor["median_ms"] / sqlite["median_ms"],
        "reserved floor p99": floor["p99_ms"] / sqlite["p99_ms"],
        "in-graph floor median": rows["in-graph floor"]["median_ms"] / sqlite["median_ms"],
        "in-graph floor p99": rows["in-graph floor"]["p99_ms"] / sqlite["p99_ms"],
        "serial floor median": rows["serial floor"]["median_ms"] / sqlite["median_ms"],
        "serial floor p99": rows["serial floor"]["p99_ms"] / sqlite["p99_ms"],
    }
    if "PostgresSaver" in rows:
        pg = rows["PostgresSaver"]
        out["pg median"] = durable["median_ms"] / pg["median_ms"]
        out["pg p99"] = durable["p99_ms"] / pg["p99_ms"]
        out["pg bytes"] = durable["bytes"] / pg["bytes"]
        ours = rows["PgThreadSaver"]
        out["pgthread median"] = ours["median_ms"] / pg["median_ms"]
        out["pgthread p99"] = ours["p99_ms"] / pg["p99_ms"]
        out["pgthread bytes"] = ours["bytes"] / pg["bytes"]
    return out


def format_ratios(found: dict[str, float]) -> str:
    """One line: the target ratios, then the floor's."""
    parts = [f"{key} {found[key]:.3f}x" for key in TARGETS]
    parts.append(f"(vs floor: median {found['floor median']:.2f}x, p99 {found['floor p99']:.2f}x)")
    line = "DurablySaver / SqliteSaver " + ", ".join(parts[:-1]) + " " + parts[-1]
    line += "; / in-graph floor " + ", ".join(
        f"{key} {found['in-graph ' + key]:.2f}x" for key in FLOOR_TARGETS
    )
    if "pgthread median" in found:
        line += "; PgThreadSaver / PostgresSaver " + ", ".join(
            f"{key} {found['pgthread ' + key]:.3f}x" for key in PG_TARGETS
        )
    return line


def report(runs: list[dict[str, Any]], rounds: int, fs_type: str | None) -> None:
    """Print the median run's table, then each target's median ratio and its verdict."""
    versions = ", ".join(
        f"{p} {importlib.metadata.version(p)}"
        for p in (
            "langgraph",
            "langgraph-checkpoint",
            "langgraph-checkpoint-sqlite",
            "langgraph-checkpoint-postgres",
        )
    )
    load = os.getloadavg()[0]
    first = runs[0]["rows"]
    print(
        f"LangGraph agent, {rounds} tool rounds ({first['DurablySaver']['steps']} checkpoints), "
        f'durability="sync", interleaved; {len(runs)} runs, '
        f"{sum(run['wall'] for run in runs):.1f} s in all; load average {load:.2f}"
    )
    print(
        f"{platform.python_implementation()} {platform.python_version()}, {platform.machine()}, "
        f"{versions}, SQLite {sqlite3.sqlite_version}; files on {fs_type}"
    )
    print()
    print("Per saver, the median over the runs of each figure:")
    print(
        f"{'saver':<14} {'steps':>5} {'median ms':>10} {'p99 ms':>8} {'put med ms':>10} "
        f"{'in-flight med':>13} {'bytes written':>14} {'on disk':>10}"
    )
    for name in first:

        def med(key: str, name: str = name) -> float:
            return float(statistics.median(run["rows"][name][key] for run in runs))

        sizes = [run["sizes"][name] for run in runs if name in run["sizes"]]
        disk = f"{int(statistics.median(sizes)):,}" if sizes else "-"
        print(
            f"{name:<14} {first[name]['steps']:>5} {med('median_ms'):>10.3f} "
            f"{med('p99_ms'):>8.3f} {med('put_median_ms'):>10.3f} "
            f"{med('in_flight_median_ms'):>13.3f} {int(med('bytes')):>14,} "
            f"{disk:>10}"
        )
    if "PostgresSaver" in first:
        print(
            "PostgresSaver, PgThreadSaver bytes: the WAL the server generated in each one's "
            "turns (their clients send with send(), which wchar does not count)"
        )
    print(
        "floors: DurablySaver's calls replayed on a bare file right after each of its turns, "
        "each as one write of the same size:"
    )
    print("  append floor: at the end of a growing file, then fdatasync (the saver's old append)")
    print("  reserved floor: O_DSYNC, into space reserved ahead (the saver's append now)")
    print(
        "in-graph floors: savers run in their own graph whose put and put_writes each do one "
        "O_DSYNC write of DurablySaver's size for that call, and nothing else:"
    )
    print("  in-graph floor: puts and put_writes to a file each, at once (a put does not wait)")
    print("  serial floor: one write at a time, as one log needs (a put waits, as DurablySaver's)")
    print(
        "  the lowest per-step latency any durable saver can have inside LangGraph here; "
        "for information, the targets are on DurablySaver"
    )
    print(
        "in-flight med: per step, the time at least one of its calls ran (a put waiting for "
        "the step's put_writes counted once); for information, the targets are on median"
    )
    print()
    found = {key: [run["ratios"][key] for run in runs] for key in runs[0]["ratios"]}
    for key, target in TARGETS.items():
        _verdict("DurablySaver / SqliteSaver", key, found[key], target)
    for key, target in FLOOR_TARGETS.items():
        _verdict("DurablySaver / in-graph floor", key, found[f"in-graph {key}"], target)
    print(
        f"DurablySaver / reserved floor median {statistics.median(found['floor median']):.3f}x, "
        f"p99 {statistics.median(found['floor p99']):.3f}x"
    )
    for floor in ("append floor", "reserved floor"):
        print(
            f"{floor} / SqliteSaver median {statistics.median(found[floor + ' median']):.3f}x, "
            f"p99 {statistics.median(found[floor + ' p99']):.3f}x"
        )
    for floor in ("in-graph floor", "serial floor"):
        parts = []
        for key in ("median", "p99"):
            ratio = statistics.median(found[f"{floor} {key}"])
            reach = "within" if ratio <= TARGETS[key] else "above"
            parts.append(f"{key} {ratio:.3f}x ({reach} the {TARGETS[key]}x target)")
        print(f"{floor} / SqliteSaver " + ", ".join(parts))
    if "pg median" in found:
        print(
            f"DurablySaver / PostgresSaver median {statistics.median(found['pg median']):.3f}x, "
            f"p99 {statistics.median(found['pg p99']):.3f}x, "
            f"bytes {statistics.median(found['pg bytes']):.3f}x"
        )
        for key, target in PG_TARGETS.items():
            _verdict("PgThreadSaver / PostgresSaver", key, found[f"pgthread {key}"], target)
        print(f"PgThreadSaver / PostgresSaver p99 {statistics.median(found['pgthread p99']):.3f}x")


def _verdict(pair: str, key: str, ratios: list[float], target: float) -> None:
    """One target's line: the median of the runs' ratios, met or not, and every run's."""
    ratio = statistics.median(ratios)
    verdict = "met" if ratio <= target else "NOT met"
    each = ", ".join(f"{value:.3f}" for value in ratios)
    print(
        f"{pair} {key:<6}: {ratio:7.3f}x median of runs "
        f"(target <= {target}x: {verdict}); runs: {each}"
    )


if __name__ == "__main__":
    main()
