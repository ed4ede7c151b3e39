"""Child processes of the Postgres tests: each owns runs the way a real process would.

Usage: ``python _pg_child.py <command> <dsn> <lease-seconds> ...``. Commands:

- ``hold RUN``: open RUN, print ``ready <token>``; on each ``save`` line on stdin,
  save state B and print ``saved`` or ``lease-lost``; close when stdin closes.
- ``hold-many RUN...``: open every RUN, print JSON ``{"tokens": {run: token}}``; on each
  ``save`` line, save state B of every run at once and print JSON ``{"outcomes": {run:
  "saved" | "lease-lost"}, "grouped": N}`` (N: the store's ``stats.grouped`` so far).
- ``try-open RUN``: try once to open RUN; print JSON ``{"outcome", "token"}``.
- ``agent RUN ROOT``: start (or resume) RUN of the ledger job in ROOT; print JSON
  ``{"outcome": "done" | "paused" | "lease-lost"}``.
- ``worker ROOT CONCURRENCY DWELL``: serve the ledger job until SIGTERM, writing the
  store's counters to ``ROOT/stats-<pid>.json`` as it goes.
- ``prune BATCH LABEL``: print ``pruning``, prune every finished run (``older_than`` 0),
  BATCH runs a statement, under a CrashPlan that SIGKILLs this process at crash point
  LABEL (``label@N``: its Nth time; empty: none, the test kills it); print the report
  as JSON if it is never reached.

On SIGUSR1 a child writes the stack of every asyncio task it has to stderr: a test
that waits on a silent child asks for them before it fails.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]

from _pg_jobs import make_agent, make_registry  # noqa: E402

import durably  # noqa: E402
from _helpers.samples import state_b  # noqa: E402
from durably.faults import CrashPlan, installed  # noqa: E402
from durably.postgres import (  # noqa: E402
    PostgresRun,
    PostgresStore,
    _groupcommit,
    housekeeping,
    work,
)


def dump_tasks() -> None:
    """Every asyncio task's stack, to stderr: where a silent child is waiting."""
    for task in asyncio.all_tasks():
        print(f"--- task {task.get_name()}", file=sys.stderr)
        task.print_stack(file=sys.stderr)
    sys.stderr.flush()


def say(message: object) -> None:
    print(json.dumps(message) if not isinstance(message, str) else message, flush=True)


async def hold(store: PostgresStore, run_id: str) -> None:
    handle, _ = await store.open(run_id)
    say(f"ready {handle.token}")
    while line := (await asyncio.to_thread(sys.stdin.readline)).strip():
        if line == "save":
            try:
                await handle.save(state_b(run_id))
            except durably.LeaseLost:
                say("lease-lost")
            else:
                say("saved")
    await handle.close()


async def hold_many(store: PostgresStore, run_ids: list[str]) -> None:
    # Two save statements in flight at most, as in test_pg_group_commit.py: of five
    # runs saving at once, the last three share one statement.
    _groupcommit.SAVES_IN_FLIGHT = 2  # the test's setting, in this process
    handles = [(await store.open(run_id))[0] for run_id in run_ids]
    say({"tokens": {h.run_id: h.token for h in handles}})

    async def save(handle: PostgresRun) -> str:
        try:
            await handle.save(state_b(handle.run_id))
        except durably.LeaseLost:
            return "lease-lost"
        return "saved"

    while line := (await asyncio.to_thread(sys.stdin.readline)).strip():
        if line == "save":
            outcomes = await asyncio.gather(*(save(h) for h in handles))
            say(
                {
                    "outcomes": dict(zip(run_ids, outcomes, strict=True)),
                    "grouped": store.stats.grouped,
                }
            )
    for handle in handles:
        await handle.close()


async def try_open(store: PostgresStore, run_id: str) -> None:
    try:
        handle, _ = await store.open(run_id)
    except durably.Locked:
        say({"outcome": "locked"})
    else:
        say({"outcome": "opened", "token": handle.token})
        await handle.close()


async def agent(store: PostgresStore, run_id: str, root: Path) -> None:
    job = make_agent(root, store)
    try:
        if run_id in await store.list_runs():
            outcome = await job.resume(run_id)
        else:
            outcome = await job.run("settle the ledger", run_id=run_id)
    except durably.LeaseLost as exc:
        say({"outcome": "lease-lost", "token": exc.token})
    else:
        say({"outcome": outcome.status, "answer": outcome.answer})


async def worker(store: PostgresStore, root: Path, concurrency: int, dwell: float) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    stats = root / f"stats-{os.getpid()}.json"

    async def report_stats() -> None:
        while True:
            temporary = stats.with_suffix(".tmp")
            temporary.write_text(json.dumps(asdict(store.stats)))
            temporary.replace(stats)
            await asyncio.sleep(0.25)

    reporter = asyncio.create_task(report_stats())
    registry = make_registry(root, dwell=dwell)
    say("working")
    report = await work(store, registry=registry, concurrency=concurrency, stop=stop, poll=0.1)
    reporter.cancel()
    stats.write_text(json.dumps(asdict(store.stats)))
    say(asdict(report))


async def prune(store: PostgresStore, batch: int, label: str) -> None:
    name, _, occurrence = label.partition("@")
    plan = CrashPlan(label=name or None, occurrence=int(occurrence or 1))
    say("pruning")
    with installed(plan):
        report = await housekeeping.prune(store, older_than=timedelta(0), batch=batch)
    say({"pruned": len(report.pruned), "owned": list(report.owned)})


async def main(command: str, dsn: str, lease: str, *args: str) -> None:
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump_tasks)
    seconds = float(lease)
    async with PostgresStore(
        dsn, lease=timedelta(seconds=seconds), renew_every=timedelta(seconds=seconds / 4)
    ) as store:
        if command == "hold":
            await hold(store, args[0])
        elif command == "hold-many":
            await hold_many(store, list(args))
        elif command == "try-open":
            await try_open(store, args[0])
        elif command == "agent":
            await agent(store, args[0], Path(args[1]))
        elif command == "worker":
            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
            await worker(store, Path(args[0]), int(args[1]), float(args[2]))
        elif command == "prune":
            await prune(store, int(args[0]), args[1] if len(args) > 1 else "")
        else:
            sys.exit(f"unknown command {command!r}")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
