"""Workers: submitted runs get started, crashed runs get finished, shutdown hands runs back."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path

import pytest
from _pg_jobs import ANSWER, CALLS, JOB, Ledger, make_registry
from _pg_procs import Child
from _pg_sql import sql

import durably
from _helpers.patience import stretched
from _helpers.samples import state_a
from durably.postgres import PostgresRun, PostgresStore, Registry, WorkReport, submit, work
from durably.postgres import queue as postgres_queue
from durably.postgres import worker as worker_module
from durably.state import Phase

pytestmark = pytest.mark.postgres

TESTS = Path(__file__).parent


def in_doubt(dsn: str, call_id: str) -> int:
    """How many runs hold an attempt marker for ``call_id`` (each run read through a store)."""

    async def count() -> int:
        async with PostgresStore(dsn) as store:
            states = [await store.read(run_id) for run_id in await store.list_runs()]
        return sum(call_id in state.markers for state in states)

    return asyncio.run(count())


def phases(dsn: str) -> dict[str, str]:
    """Each run's phase, by run ID."""
    return dict(sql(dsn, "SELECT run_id, phase FROM durably_runs"))


async def work_until(
    store: PostgresStore,
    registry: Registry,
    finished: Callable[[], Awaitable[bool]],
    *,
    concurrency: int = 4,
    within: float = 30,
) -> WorkReport:
    """Run a worker until ``finished()`` says so, then stop it and return its report."""
    stop = asyncio.Event()
    worker = asyncio.create_task(
        work(store, registry=registry, concurrency=concurrency, stop=stop, poll=0.05)
    )
    deadline = time.monotonic() + within
    while not await finished():
        assert time.monotonic() < deadline, "the worker did not finish in time"
        assert not worker.done(), worker
        await asyncio.sleep(0.05)
    stop.set()
    return await worker


def all_done(dsn: str) -> Callable[[], Awaitable[bool]]:
    """A check for ``work_until``: every run in the database is done."""

    async def check() -> bool:
        return all(p == "done" for p in (await asyncio.to_thread(phases, dsn)).values())

    return check


def assert_each_call_acted_once(root: Path, run_ids: list[str]) -> None:
    """The ledger holds each run's calls exactly once."""
    effects = sorted((e["run_id"], e["call_id"]) for e in Ledger(root).effects())
    assert effects == sorted((r, c) for r in run_ids for c in CALLS)


def test_a_worker_starts_and_finishes_every_submitted_run(pg_dsn: str, tmp_path: Path) -> None:
    """Submitted runs are started by a worker as Agent.run would, and each finishes once."""

    async def main() -> tuple[WorkReport, list[str]]:
        async with PostgresStore(pg_dsn) as store:
            run_ids = [
                await submit(store, agent_name=JOB, task="settle the ledger") for _ in range(6)
            ]
            report = await work_until(
                store, make_registry(tmp_path), all_done(pg_dsn), concurrency=3
            )
            states = [await store.read(r) for r in run_ids]
        assert all(s.answer == ANSWER and s.resumes == 0 and s.fingerprint for s in states)
        return report, run_ids

    report, run_ids = asyncio.run(main())
    assert (report.claimed, report.started, report.done) == (6, 6, 6)
    assert_each_call_acted_once(tmp_path, run_ids)


def test_a_run_whose_worker_died_is_finished_by_another(pg_dsn: str, tmp_path: Path) -> None:
    """A worker killed with a call in flight leaves an in-doubt call; once its lease expires a
    second worker claims the run, settles the call by lookup and finishes the run.
    """
    (tmp_path / "pause").write_text("note")

    async def enqueue() -> None:
        async with PostgresStore(pg_dsn) as store:
            await submit(store, agent_name=JOB, task="settle the ledger", run_id="w1")

    asyncio.run(enqueue())
    with Child("worker", pg_dsn, "1.0", str(tmp_path), "1", "0", log=tmp_path / "w.log") as first:
        assert first.line() == "working"
        deadline = time.monotonic() + stretched(30)
        while not (tmp_path / "acted").exists():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        first.kill()
    (tmp_path / "pause").unlink()

    async def second() -> tuple[WorkReport, durably.RunState]:
        async with PostgresStore(pg_dsn, lease=timedelta(seconds=5)) as store:
            assert list((await store.read("w1")).markers) == ["n1"]
            report = await work_until(store, make_registry(tmp_path), all_done(pg_dsn))
            return report, await store.read("w1")

    report, state = asyncio.run(second())
    assert (report.claimed, report.started, report.done) == (1, 0, 1)
    assert state.resumes == 1
    assert state.resolutions["n1"].outcome == "found"
    assert_each_call_acted_once(tmp_path, ["w1"])


def test_runs_that_cannot_go_on_are_parked_not_retried(
    pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose agent cannot be built, or whose state is corrupt, is parked with the reason
    and never claimed again; runs of agents the worker does not know are left alone.

    Parking is made slow here: a worker that freed the lease before the run was parked
    would claim it again in that gap (this once failed CI, 1 time in many).
    """
    park = postgres_queue.park  # what the worker calls, until replaced below

    async def slow_park(handle: PostgresRun, reason: str) -> bool:
        await asyncio.sleep(0.3)
        return await park(handle, reason)

    monkeypatch.setattr(worker_module, "park", slow_park)

    def broken(run_id: str) -> durably.Agent:
        raise RuntimeError("the model key is missing")

    registry = make_registry(tmp_path)
    registry.register("broken", broken)

    async def main() -> tuple[WorkReport, WorkReport]:
        async with PostgresStore(pg_dsn) as store:
            await submit(store, agent_name="broken", task="x", run_id="b1")
            await submit(store, agent_name="elsewhere", task="x", run_id="e1")
            await (await store.create(state_a("c1"))).close()
        sql(
            pg_dsn, "UPDATE durably_runs SET agent = %s, state = 'garbage' WHERE run_id = 'c1'", JOB
        )

        async def parked() -> bool:
            rows = await asyncio.to_thread(
                sql, pg_dsn, "SELECT count(*) FROM durably_runs WHERE parked IS NOT NULL"
            )
            return bool(rows[0][0] == 2)

        async with PostgresStore(pg_dsn) as store:
            first = await work_until(store, registry, parked)
            # A second pass claims nothing: parked runs and unknown agents are not work.
            again = await work_until(store, registry, _after(0.5))
        return first, again

    first, again = asyncio.run(main())
    assert (first.claimed, first.parked) == (2, 2)
    assert again.claimed == 0
    reasons = dict(sql(pg_dsn, "SELECT run_id, parked FROM durably_runs WHERE parked IS NOT NULL"))
    assert "the model key is missing" in reasons["b1"]
    assert "CheckpointCorrupt" in reasons["c1"]
    assert sql(pg_dsn, "SELECT token FROM durably_runs WHERE run_id = 'e1'") == [(0,)]


def _after(seconds: float) -> Callable[[], Awaitable[bool]]:
    deadline = time.monotonic() + seconds

    async def check() -> bool:
        return time.monotonic() >= deadline

    return check


def durably_cli(*args: str, root: Path) -> subprocess.Popen[str]:
    """Start ``durably`` with the tests' job importable and its ledger under ``root``."""
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)]),
        "DURABLY_TEST_ROOT": str(root),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "durably", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=environment,
        cwd=root,
    )


def stop_when(
    worker: subprocess.Popen[str], ready: Callable[[], bool], *, within: float, what: str
) -> str:
    """SIGTERM the running ``worker`` once ``ready()`` (within ``within`` s); its output.

    The worker must still be running until then; it is killed if anything fails.
    """
    try:
        deadline = time.monotonic() + within
        while not ready():
            assert time.monotonic() < deadline, f"not within {within} s: {what}"
            assert worker.poll() is None
            time.sleep(0.05)
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=stretched(30))
        return out
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()


def test_sigterm_hands_runs_in_flight_back_at_once(pg_dsn: str, tmp_path: Path) -> None:
    """``durably worker`` stops on SIGTERM after the runs' current saves and frees their leases,
    so another worker resumes them at once, though the lease is long.
    """
    run_ids = []
    for _ in range(2):
        submitted = durably_cli(
            "submit", "--dsn", pg_dsn, "--agent", JOB, "--import", "_pg_cli_agents", root=tmp_path
        )
        out, _ = submitted.communicate(timeout=stretched(30))
        assert submitted.returncode == 0, out
        run_ids.append(out.strip())
    (tmp_path / "pause").write_text("note")
    worker = durably_cli(
        "worker",
        "--dsn",
        pg_dsn,
        "--concurrency",
        "2",
        "--lease",
        "60",
        "--import",
        "_pg_cli_agents",
        root=tmp_path,
    )
    out = stop_when(
        worker, lambda: in_doubt(pg_dsn, "n1") >= 2, within=30, what="the runs reached their note"
    )
    assert worker.returncode == 0, out
    assert "2 handed back" in out
    assert sql(pg_dsn, "SELECT count(*) FROM durably_runs WHERE expires_at IS NULL") == [(2,)]
    (tmp_path / "pause").unlink()

    async def resume() -> WorkReport:
        async with PostgresStore(pg_dsn, lease=timedelta(seconds=60)) as store:
            return await work_until(store, make_registry(tmp_path), all_done(pg_dsn), within=20)

    report = asyncio.run(resume())
    assert report.done == 2
    assert_each_call_acted_once(tmp_path, run_ids)


def test_the_cli_runs_a_submitted_triage_task(pg_dsn: str, tmp_path: Path) -> None:
    """``durably submit --agent triage:<task>`` queues the triage demo and ``durably worker``
    runs it to its answer, its world under ``--state``.
    """
    submitted = durably_cli(
        "submit", "--dsn", pg_dsn, "--agent", "triage:m1-done-after-delete", root=tmp_path
    )
    out, _ = submitted.communicate(timeout=stretched(30))
    assert submitted.returncode == 0, out
    run_id = out.strip()
    worker = durably_cli(
        "worker", "--dsn", pg_dsn, "--state", str(tmp_path / "state"), root=tmp_path
    )
    out = stop_when(
        worker,
        lambda: phases(pg_dsn).get(run_id) == Phase.DONE,
        within=60,
        what="the triage run finished",
    )
    assert worker.returncode == 0, out
    assert (tmp_path / "state" / "worlds" / run_id / "world.json").exists()


def test_submit_refuses_an_agent_no_worker_would_claim(pg_dsn: str, tmp_path: Path) -> None:
    """A run queued for a name nothing registers would wait for ever: submit refuses it,
    names what is registered and how to register more, and queues nothing (issue 31, 13).
    """
    submitted = durably_cli(
        "submit", "--dsn", pg_dsn, "--agent", "no-such-agent", "--task", "x", root=tmp_path
    )
    out, _ = submitted.communicate(timeout=stretched(30))
    assert submitted.returncode == 2, out
    assert "no agent named 'no-such-agent' is registered" in out
    assert "triage:m1-done-after-delete" in out  # what is registered
    assert "--import MODULE" in out
    tables = sql(pg_dsn, "SELECT to_regclass('durably_runs') IS NOT NULL")
    if tables == [(True,)]:
        assert sql(pg_dsn, "SELECT count(*) FROM durably_runs") == [(0,)]
