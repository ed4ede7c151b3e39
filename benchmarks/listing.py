"""How long ``durably runs DIR`` takes over many runs, through the listing index.

Issue 19: listing 2,000 journal runs of ~80 KB took 4.1 s, growing with the bytes
of every run; the target is 10,000 runs in at most 1 s, without reading whole
states. This makes ``--runs`` runs (default 10,000) of realistic size in each file
store layout (snapshot: one ~30 KB file per run; journal: a ~40 KB snapshot and a
log of ~30 KB appended over 16 saves, ~80 KB a run), a few of them paused with
questions, then times the whole ``durably runs DIR`` process (output to
/dev/null), median of ``--repeat``:

- ``full``: the baseline, measured in the same run: a process that loads every
  run whole (``listing.list_runs_fully``) and prints the same table;
- ``cold``: no index (removed before each repeat): every run is loaded and the
  index written;
- ``warm``: the index is up to date: no run is loaded;
- ``touched``: 1% of the runs were saved again since the index was written
  (other runs each repeat): those are loaded.

Prints each median, its ratio to ``full``, and whether the target (``warm`` and
``touched`` at most 1 s for 10,000 runs) is met. The runs are made once per
directory and kept with ``--keep DIR`` (made again only if missing).

With ``--layout postgres`` (issue 38) it times ``durably runs --dsn`` over ``--runs``
runs in a throwaway Postgres cluster (or ``--dsn``): 5% queued, 1% paused with
questions, the rest done with 8 replies (~10 KB a state), every one with its summary
columns. ``columns`` is the ``durably runs --dsn`` process, the listing from the summary
columns (paused runs are read whole, for their questions); ``in-proc`` the same
listing inside a started process (no interpreter start-up); ``full`` the baseline
that reads every state whole (``listing.list_runs_fully`` over the store), measured in the same run.

Run: ``.venv/bin/python benchmarks/listing.py [--runs N] [--repeat R] [--keep DIR]``
(``--full-repeat 1`` times the slow baseline once; ``--layout journal`` one layout only;
``--layout postgres [--dsn DSN]`` the Postgres listing).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from durably.state import (
    Approval,
    AssistantMessage,
    Phase,
    RunState,
    ToolCall,
    ToolResult,
    UserMessage,
    utcnow,
)
from durably.stores import _index
from durably.stores.file import FileStore
from durably.stores.journal import JournalStore

TARGET_S = 1.0
TARGET_RUNS = 10_000
_TEXT = "lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 8  # ~460 bytes

_FULL = """
import sys
from pathlib import Path
from durably.listing import list_runs_fully, render
from durably.stores.journal import JournalStore
import asyncio
store = JournalStore(sys.argv[1])
listing = asyncio.run(list_runs_fully(store))
sys.stdout.write(render(listing.summaries, [r for r, _ in listing.unreadable],
                        title=f"runs in {sys.argv[1]}"))
"""


def a_state(n: int, replies: int) -> RunState:
    """Run ``n`` with ``replies`` replies of ~1 KB each and their results."""
    state = RunState(
        run_id=f"run-{n:06d}",
        task="triage the flaky test in tests/test_cache.py and fix it",
        created_at=utcnow() - timedelta(minutes=n),
        messages=[UserMessage(text=_TEXT)],
        phase=Phase.DONE,
    )
    for turn in range(1, replies + 1):
        grow(state, turn)
    return state


def grow(state: RunState, turn: int) -> None:
    """Add one turn (a tool call and its result) to ``state``."""
    call = ToolCall(id=f"c{turn}", name="run_tests", arguments='{"path": "tests/"}')
    state.messages.append(AssistantMessage(text=_TEXT, calls=(call,), turn=turn, dollars=0.002))
    state.messages.append(ToolResult(call_id=call.id, name="run_tests", content=_TEXT * 3))
    state.turns = turn
    state.dollars += 0.002
    state.saved_at = utcnow()


def make_runs(directory: Path, runs: int, *, journal: bool) -> None:
    """``runs`` runs in one layout; every 50th paused with an approval question."""
    store: FileStore = (
        JournalStore(directory, sync=False, compact_min_bytes=1 << 30)
        if journal
        else FileStore(directory, sync=False)
    )
    first = 25 if journal else 15  # snapshot: ~30 KB; journal: ~48 KB snapshot...
    for n in range(runs):
        state = a_state(n, first)
        handle = store.create_sync(state)
        if journal:
            for turn in range(first + 1, first + 17):  # ...and ~30 KB of log over 16 saves
                state.phase = Phase.TOOLS
                grow(state, turn)
                state.phase = Phase.DONE
                handle.save_sync(state)
        if n % 50 == 0:
            state.phase = Phase.PAUSED
            call = ToolCall(id="refund-1", name="refund", arguments='{"cents": 2500}')
            state.messages.append(AssistantMessage(calls=(call,), turn=state.turns + 1))
            state.pending = {
                "refund-1": Approval(
                    call_id="refund-1", tool="refund", arguments=call.arguments, asked_at=utcnow()
                )
            }
            handle.save_sync(state)
        handle.close_sync()
        if n and n % 1000 == 0:
            print(f"  {directory.name}: {n} runs made", file=sys.stderr)
    store.close_sync()


def touch(directory: Path, runs: int, round_: int, *, journal: bool) -> None:
    """Save 1% of the runs again (different ones each round), as running agents do."""
    store: FileStore = (
        JournalStore(directory, sync=False, compact_min_bytes=1 << 30)
        if journal
        else FileStore(directory, sync=False)
    )
    count = max(1, runs // 100)
    for k in range(count):
        n = (round_ * count + k) * 7 % runs
        handle, state = store.open_sync(f"run-{n:06d}")
        state.resumes += 1
        state.saved_at = utcnow()
        handle.save_sync(state)
        handle.close_sync()
    store.close_sync()


_PG_FULL = """
import asyncio, sys
from durably.listing import list_runs_fully, render_fleet
from durably.postgres import PostgresStore

async def main():
    async with PostgresStore(sys.argv[1]) as store:
        return await list_runs_fully(store)

listing = asyncio.run(main())
sys.stdout.write(render_fleet(listing.summaries, [r for r, _ in listing.unreadable],
                              title="runs"))
"""


def make_postgres_runs(dsn: str, runs: int) -> None:
    """``runs`` runs in the store at ``dsn``: 5% queued, 1% paused, the rest done."""
    import asyncio

    from durably.postgres import PostgresStore, submit

    async def make() -> None:
        async with PostgresStore(dsn) as store:
            queued = runs // 20
            for n in range(queued):
                await submit(store, agent_name="ledger", task="settle", run_id=f"q-{n:06d}")
            started = list(range(runs - queued))
            for first in range(0, len(started), 100):

                async def one(n: int) -> None:
                    state = a_state(n, 8)
                    if n % 100 == 0:  # paused with questions
                        grow(state, 9)
                        state.phase = Phase.PAUSED
                    await (await store.create(state)).close()

                await asyncio.gather(*(one(n) for n in started[first : first + 100]))

    asyncio.run(make())


def in_process(dsn: str) -> float:
    """Seconds the listing takes inside a process that has started.

    The statement, the summaries and the table (what a console poll pays), without
    Python's start-up.
    """
    import asyncio

    from durably.listing import render_fleet
    from durably.postgres import PostgresStore

    async def listed() -> float:
        async with PostgresStore(dsn) as store:
            await store.migrate()  # the pool and the schema check, as once per process
            started = time.perf_counter()
            listing = await store.summaries()
            render_fleet(listing.summaries, title="runs")
            return time.perf_counter() - started

    return asyncio.run(listed())


def postgres_listing(args: argparse.Namespace, durably: str) -> bool:
    """Time ``durably runs --dsn`` against the full-load baseline; whether the target is met."""
    tests = Path(__file__).resolve().parent.parent / "tests"
    sys.path[:0] = [str(tests / "stores"), str(tests)]  # _pg_cluster imports _helpers
    from _pg_cluster import Cluster

    cluster = None if args.dsn else Cluster.start()
    try:
        dsn = args.dsn or cluster.dsn  # type: ignore[union-attr]
        started = time.perf_counter()
        make_postgres_runs(dsn, args.runs)
        made = time.perf_counter() - started
        print(f"postgres: made {args.runs} runs in {made:.1f} s", file=sys.stderr)
        columns, full, inside = [], [], []
        for round_ in range(args.repeat):
            if round_ < (args.full_repeat or args.repeat):
                full.append(timed([sys.executable, "-c", _PG_FULL, dsn]))
            columns.append(timed([durably, "runs", "--dsn", dsn]))
            inside.append(in_process(dsn))
    finally:
        if cluster is not None:
            cluster.stop()
    base = statistics.median(full)
    print(f"postgres: {args.runs} runs (5% queued, 1% paused, ~10 KB a state)")
    for name, times in {"full": full, "columns": columns, "in-proc": inside}.items():
        median = statistics.median(times)
        print(f"  {name:8} median {median:6.3f} s  ({median / base:5.2f}x full)")
    ok = bool(statistics.median(columns) <= TARGET_S * max(1.0, args.runs / TARGET_RUNS))
    print(f"  columns <= {TARGET_S:.1f} s: {'met' if ok else 'NOT met'}")
    return ok


def timed(command: list[str]) -> float:
    """Run ``command`` as a whole process; return its wall time in seconds."""
    with open(os.devnull, "w") as sink:
        started = time.perf_counter()
        subprocess.run(command, stdout=sink, stderr=subprocess.PIPE, check=True)
        return time.perf_counter() - started


def main() -> int:
    """Build the stores, time the listings, print the table and the verdict."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=TARGET_RUNS, help="runs per layout")
    parser.add_argument("--repeat", type=int, default=5, help="repeats per measurement")
    parser.add_argument("--keep", type=Path, help="make (or reuse) the runs here")
    parser.add_argument(
        "--full-repeat", type=int, help="repeats of the full-load baseline (default: --repeat)"
    )
    parser.add_argument(
        "--layout",
        choices=["journal", "snapshot", "postgres"],
        action="append",
        help="default: both file layouts (postgres: the Postgres listing, by itself)",
    )
    parser.add_argument("--dsn", help="with --layout postgres: this server, not a throwaway one")
    args = parser.parse_args()
    durably = str(Path(sys.executable).with_name("durably"))
    if args.layout == ["postgres"]:
        met = postgres_listing(args, durably)
        print(f"load: {os.getloadavg()[0]:.2f} (1-minute average)")
        verdict = "met" if met and args.runs >= TARGET_RUNS else "NOT met"
        print(f"target (10,000 Postgres runs listed in <= 1 s): {verdict}")
        return 0
    if args.layout and "postgres" in args.layout:
        parser.error("--layout postgres runs by itself")
    root = args.keep or Path(tempfile.mkdtemp(prefix="durably-listing-"))
    met = True
    try:
        for layout in args.layout or ["journal", "snapshot"]:
            directory = root / layout
            journal = layout == "journal"
            if not (directory / f"run-{args.runs - 1:06d}.json").exists():
                shutil.rmtree(directory, ignore_errors=True)
                started = time.perf_counter()
                make_runs(directory, args.runs, journal=journal)
                made = time.perf_counter() - started
                print(f"{layout}: made {args.runs} runs in {made:.1f} s", file=sys.stderr)
                time.sleep(_index.SETTLE_NS / 1e9)  # as runs nobody saved for a while
            size = sum(p.stat().st_size for p in directory.iterdir()) / args.runs / 1024
            index = directory / _index.INDEX_NAME
            runs_cmd = [durably, "runs", str(directory)]
            full, cold, warm, touched = [], [], [], []
            full_repeat = args.full_repeat or args.repeat
            for round_ in range(args.repeat):
                if round_ < full_repeat:
                    full.append(timed([sys.executable, "-c", _FULL, str(directory)]))
                index.unlink(missing_ok=True)
                cold.append(timed(runs_cmd))
                warm.append(timed(runs_cmd))
                touch(directory, args.runs, round_, journal=journal)
                touched.append(timed(runs_cmd))
            base = statistics.median(full)
            print(f"{layout}: {args.runs} runs, {size:.0f} KB a run on disk")
            measured = {"full": full, "cold": cold, "warm": warm, "touched": touched}
            for name, times in measured.items():
                median = statistics.median(times)
                print(f"  {name:8} median {median:6.3f} s  ({median / base:5.2f}x full)")
            scaled = max(statistics.median(warm), statistics.median(touched))
            ok = scaled <= TARGET_S * max(1.0, args.runs / TARGET_RUNS)
            met = met and ok and args.runs >= TARGET_RUNS and not args.layout
            print(f"  warm and touched <= {TARGET_S:.1f} s: {'met' if ok else 'NOT met'}")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    print(f"load: {os.getloadavg()[0]:.2f} (1-minute average)")
    verdict = "met" if met else "NOT met"
    if args.layout or args.runs < TARGET_RUNS:
        verdict += " (judged only over both layouts at 10,000 runs or more)"
    print(f"target (10,000 runs listed in <= 1 s, warm and after 1% touched): {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
