"""A fleet an operator can see, and workers that ride out database outages (issue 38, 1-2).

The outage tests run real ``durably worker`` processes against a throwaway cluster of
their own (the session's is shared with other tests), which they stop and start.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from _pg_cluster import Cluster
from _pg_jobs import CALLS, JOB, Ledger
from _pg_sql import sql

import durably
from _helpers.patience import stretched
from _helpers.samples import state_a, state_b, without_saved_at
from durably.postgres import PostgresStore, queue, submit
from durably.postgres.fleet import heartbeat

pytestmark = pytest.mark.postgres

TESTS = Path(__file__).parent
PATIENCE = float(os.environ.get("DURABLY_TEST_PATIENCE", "3"))
"""Waits here are guards against a hang, stretched as the session's time limits are."""


class Durably:
    """A ``durably`` command run as a child process, its output (stdout and stderr) collected."""

    def __init__(self, *args: str, root: Path, dsn: str | None = None) -> None:
        environment = {
            **os.environ,
            **({"DURABLY_DSN": dsn} if dsn is not None else {}),
            "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)]),
            "DURABLY_TEST_ROOT": str(root),
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "durably", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=environment,
            cwd=root,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        """Everything it printed so far."""
        return "\n".join(self.lines)

    def wait_for(self, ready: Callable[[], bool], *, what: str, within: float = 30) -> None:
        """Wait until ``ready()``, while the process keeps running."""
        deadline = time.monotonic() + within * PATIENCE
        while not ready():
            assert self.process.poll() is None, f"exited before {what}:\n{self.output}"
            assert time.monotonic() < deadline, f"not within {within} s: {what}\n{self.output}"
            time.sleep(0.05)

    def said(self, pattern: str) -> Callable[[], bool]:
        """A check for :meth:`wait_for`: its output matches ``pattern``."""
        return lambda: re.search(pattern, self.output) is not None

    def stop(self) -> int:
        """SIGTERM it and wait; its exit status."""
        self.process.send_signal(signal.SIGTERM)
        return self.finish()

    def finish(self) -> int:
        """Wait for it to exit; its exit status."""
        code = self.process.wait(timeout=stretched(30) * PATIENCE)
        self._close()
        return code

    def kill(self) -> None:
        """SIGKILL it if it still runs, and close its pipe."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=stretched(10))
        self._close()

    def _close(self) -> None:
        self._reader.join(timeout=stretched(10))  # it stops at EOF; only then may stdout be closed
        if self.process.stdout is not None and not self.process.stdout.closed:
            self.process.stdout.close()


@pytest.fixture
def run_durably(tmp_path: Path) -> Iterator[Callable[..., Durably]]:
    """Start ``durably ARGS`` children in ``tmp_path``; each is killed after the test."""
    started: list[Durably] = []

    def start(*args: str, dsn: str | None = None) -> Durably:
        child = Durably(*args, root=tmp_path, dsn=dsn)
        started.append(child)
        return child

    yield start
    for child in started:
        child.kill()


def phases(dsn: str) -> dict[str, str]:
    """Each run's phase, by run ID."""
    return dict(sql(dsn, "SELECT run_id, phase FROM durably_runs"))


def submit_runs(dsn: str, run_ids: list[str]) -> None:
    """Queue ledger runs under these IDs."""

    async def main() -> None:
        async with PostgresStore(dsn) as store:
            for run_id in run_ids:
                await submit(store, agent_name=JOB, task="settle the ledger", run_id=run_id)

    asyncio.run(main())


def assert_each_call_acted_once(root: Path, run_ids: list[str]) -> None:
    """The ledger holds each run's calls exactly once."""
    effects = sorted((e["run_id"], e["call_id"]) for e in Ledger(root).effects())
    assert effects == sorted((r, c) for r in run_ids for c in CALLS)


# -- what an operator sees ---------------------------------------------------------------


def test_the_listing_shows_queued_claimed_and_parked_runs_with_owner_and_lease(
    pg_dsn: str, run_durably: Callable[..., Durably]
) -> None:
    """``durably runs --dsn`` lists every run from the summary columns: queued ones, the
    one a worker claimed (its owner and when its lease expires), a parked one and a run
    that was only created; ``--phase queued|claimed|parked`` pick them; ``show`` of a
    queued run says so and whether a live worker serves its agent; ``durably workers``
    lists the live workers.
    """

    async def prepare() -> str:
        async with PostgresStore(pg_dsn, owner="worker-A", lease=timedelta(seconds=60)) as store:
            for run_id in ("q1", "q2", "q3"):
                await submit(store, agent_name=JOB, task="settle the ledger", run_id=run_id)
            claims = await queue.claim(store, agents=[JOB], limit=2)  # q1 and q2
            assert [c.run_id for c in claims] == ["q1", "q2"]
            await claims[0].handle.save(state_a("q1"))
            assert await queue.park(claims[1].handle, "the model key is missing")
            for claimed in claims:
                await claimed.handle.close(release=claimed.run_id != "q1")
            await (await store.create(state_a("c1"))).close()
            return store.owner

    asyncio.run(prepare())
    listing = run_durably("runs", "--dsn", pg_dsn, "--sort", "run")
    assert listing.finish() == 0, listing.output
    rows = {line.split("│")[1].strip(): line for line in listing.lines if line.startswith("│")}
    assert sorted(rows) == ["c1", "q1", "q2", "q3"]
    header = next(line for line in listing.lines if line.startswith("┃"))
    for column in ("agent", "owner", "lease", "restarts", "age"):
        assert f" {column} " in header
    assert re.search(r"│ q1 +│ model +│ ledger +│ worker-A +│ expires in \d+s", rows["q1"])
    assert re.search(r"│ q2 +│ queued, parked +│ ledger +│ worker-A +│ - ", rows["q2"])
    assert re.search(r"│ q3 +│ queued +│ ledger +│ - +│ - ", rows["q3"])
    assert re.search(r"│ c1 +│ model +│ - +│ ", rows["c1"])

    def picked(phase: str) -> list[str]:
        shown = run_durably("runs", "--dsn", pg_dsn, "--phase", phase, "--sort", "run")
        assert shown.finish() == 0, shown.output
        return [line.split("│")[1].strip() for line in shown.lines if line.startswith("│")]

    assert picked("queued") == ["q2", "q3"]
    assert picked("claimed") == ["q1"]
    assert picked("parked") == ["q2"]

    shown = run_durably("show", "q3", "--dsn", pg_dsn)
    assert shown.finish() == 0, shown.output
    assert "queued: submitted, not yet started by a worker" in shown.output
    assert "no live worker serves agent 'ledger'" in shown.output

    async def beat() -> None:
        async with PostgresStore(pg_dsn, owner="worker-B") as store:
            await heartbeat(store, agents=[JOB, "other"], concurrency=4, ttl=timedelta(minutes=5))

    asyncio.run(beat())
    shown = run_durably("show", "q3", "--dsn", pg_dsn)
    assert shown.finish() == 0, shown.output
    assert "1 live worker(s) serve 'ledger': worker-B" in shown.output
    workers = run_durably("workers", "--dsn", pg_dsn)
    assert workers.finish() == 0, workers.output
    assert "1 live worker(s) in postgresql://127.0.0.1:" in workers.output
    assert re.search(r"│ worker-B +│ ledger, other +│ 0/4 +│", workers.output), workers.output


def test_lease_lost_says_whether_the_lease_lapsed_or_who_took_the_run(pg_dsn: str) -> None:
    """A save after the lease lapsed with nobody taking the run says it lapsed; after this
    worker claimed it again, says so; after another owner took it, names that owner.
    """

    async def main() -> list[str]:
        said: list[str] = []
        async with (
            PostgresStore(pg_dsn, owner="worker-A", lease=timedelta(seconds=60)) as mine,
            PostgresStore(pg_dsn, owner="worker-B", lease=timedelta(seconds=60)) as theirs,
        ):
            for taker in (None, mine, theirs):
                run_id = f"r{len(said)}"
                handle = await mine.create(state_a(run_id))
                sql(pg_dsn, "UPDATE durably_runs SET expires_at = now() WHERE run_id = %s", run_id)
                if taker is not None:
                    again, _ = await taker.open(run_id)
                    await again.close()
                with pytest.raises(durably.LeaseLost) as lost:
                    await handle.save(state_a(run_id))
                said.append(str(lost.value))
                await handle.close()
        return said

    lapsed, reclaimed, taken = asyncio.run(main())
    assert "lapsed" in lapsed
    assert "no other worker has taken the run since" in lapsed
    assert "this worker claimed the run again (token 2)" in reclaimed
    assert "was taken over by worker-B (token 2)" in taken
    assert "taken over" not in lapsed + reclaimed


# -- workers through outages -------------------------------------------------------------


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[Cluster]:
    """A cluster these tests stop and start (never the session's shared one)."""
    cluster = Cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def own_dsn(own_cluster: Cluster) -> str:
    """A fresh schema in :func:`own_cluster`, reached over TCP, with a password in the DSN
    (the cluster trusts local connections, so it is never checked) that no message may show.
    """
    own_cluster.wait_ready()
    schema = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(own_cluster.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}".encode())
    return f"{own_cluster.dsn} password=hunter2secret options='-c search_path={schema}'"


def start_worker(run_durably: Callable[..., Durably], dsn: str, *args: str) -> Durably:
    """``durably worker`` serving the ledger job, its DSN (with the password) in $DURABLY_DSN."""
    return run_durably("worker", "--lease", "3", "--import", "_pg_cli_agents", *args, dsn=dsn)


def test_a_worker_started_with_the_database_down_finishes_its_runs_once_it_comes_up(
    own_cluster: Cluster, own_dsn: str, tmp_path: Path, run_durably: Callable[..., Durably]
) -> None:
    """Started while the server is down, the worker waits (saying for which database, and
    why: the connection is refused), then claims and finishes every run once it is up.
    """
    run_ids = ["d1", "d2"]
    submit_runs(own_dsn, run_ids)
    own_cluster.halt()
    try:
        worker = start_worker(run_durably, own_dsn, "--wait-for-database", "120")
        where = f"postgresql://127.0.0.1:{own_cluster.port}/postgres"
        waits = f"waiting for the database {re.escape(where)}: .*[Rr]efused"
        worker.wait_for(
            lambda: len(re.findall(waits, worker.output)) >= 2, what="two waits for the database"
        )
    finally:
        own_cluster.resume()
    worker.wait_for(
        lambda: set(phases(own_dsn).values()) == {"done"}, what="every run done", within=60
    )
    assert worker.stop() == 0, worker.output
    assert "2 done" in worker.output
    assert "hunter2secret" not in worker.output
    assert "run '-'" not in worker.output
    assert "disk" not in worker.output
    assert_each_call_acted_once(tmp_path, run_ids)


def test_a_worker_gives_up_after_its_wait_for_the_database_naming_it(
    own_cluster: Cluster, own_dsn: str, run_durably: Callable[..., Durably]
) -> None:
    """The wait is bounded by ``--wait-for-database``: then exit 1, naming the database and the
    real cause, never a run, the disk or the password.
    """
    own_cluster.halt()
    try:
        worker = start_worker(run_durably, own_dsn, "--wait-for-database", "1")
        code = worker.finish()
    finally:
        own_cluster.resume()
    assert code == 1, worker.output
    assert f"postgresql://127.0.0.1:{own_cluster.port}/postgres" in worker.output
    assert re.search("refused", worker.output, re.IGNORECASE), worker.output
    assert "--wait-for-database" in worker.output
    assert "hunter2secret" not in worker.output
    assert "run '-'" not in worker.output
    assert "disk" not in worker.output


def test_runs_go_on_through_a_server_restart_and_a_dead_worker_is_taken_over(
    own_cluster: Cluster, own_dsn: str, tmp_path: Path, run_durably: Callable[..., Durably]
) -> None:
    """A worker holding runs in flight rides out a server crash and a restart that take longer
    than its renewal period (each lease's renewal waits through the outage and lands before
    the lease runs out); a second worker SIGKILLed with a call in flight is taken over, and
    the log says from whom, how long ago its lease expired, and the ladder's decision.
    """
    submit_runs(own_dsn, ["s1", "s2"])
    (tmp_path / "pause").write_text("note")  # each run stops after its first note acted
    first = start_worker(run_durably, own_dsn, "--concurrency", "2")
    first.wait_for(lambda: (tmp_path / "acted").exists(), what="a note acted")
    first.process.kill()  # SIGKILL, a call in flight: its runs wait for their leases to expire
    first.finish()
    owner = re.search(r"worker (\S+): ", first.output)
    assert owner is not None, first.output
    # A lease of 15 s is renewed every 5 s: down for 6 s, the server misses at least one
    # renewal of each lease (its retries wait it out), and is back long before the lease
    # (renewed at most 5 s before the crash) runs out.
    second = start_worker(run_durably, own_dsn, "--concurrency", "2", "--lease", "15")
    second.wait_for(second.said("took over s1"), what="the takeover")
    second.wait_for(second.said("took over s2"), what="the second takeover")
    own_cluster.halt()  # an immediate stop, as a crash: every connection breaks
    time.sleep(6)
    own_cluster.resume()
    (tmp_path / "pause").unlink()
    second.wait_for(
        lambda: set(phases(own_dsn).values()) == {"done"}, what="every run done", within=60
    )
    assert second.stop() == 0, second.output
    out = second.output
    for run_id in ("s1", "s2"):
        assert re.search(
            rf"took over {run_id} from {re.escape(owner[1])} \(lease expired \d+\.\ds ago\)", out
        ), out
    assert re.search(r"s\d: in doubt note n1: ladder step 2 \(lookup\) -> found", out), out
    assert "lease (token" not in out, f"a lease was lost in the outage:\n{out}"
    assert "2 done" in out, out
    assert "0 lost to another worker" in out, out
    assert "0 failed" in out, out
    assert_each_call_acted_once(tmp_path, ["s1", "s2"])


# -- stopping and cleaning up --------------------------------------------------------------


def test_a_save_begun_in_an_outage_lands_once_the_server_is_back_not_at_the_pools_next_try(
    own_cluster: Cluster, own_dsn: str
) -> None:
    """psycopg_pool tries to reconnect 1, 2, 4, 8 s apart (each within 10%), and gives up
    one lease after its first try: down for 17 s, its next try comes 27 s after that first
    try, at least a second after the 27 s lease, taken a second before the outage, ran
    out. A save begun as the server went down lands once it is back, on a connection of
    its own, and the lease holds; without the bypass it waits for the pool and fails.
    A slow stop and start, up to about 7 s together, still leave the save time.
    """

    async def scenario() -> tuple[durably.RunState | None, int]:
        async with PostgresStore(own_dsn, lease=timedelta(seconds=27)) as store:
            handle = await store.create(state_a("o1"))
            await asyncio.sleep(1)
            await asyncio.to_thread(own_cluster.halt)
            saving = asyncio.create_task(handle.save(state_b("o1")))
            await asyncio.sleep(17)
            await asyncio.to_thread(own_cluster.resume)
            await saving
            await handle.close()
            return await store.read("o1"), store.stats.bypassed

    saved, bypassed = asyncio.run(scenario())
    assert saved is not None
    assert without_saved_at(saved) == state_b("o1")
    assert bypassed >= 1


def test_a_cancelled_queued_run_is_never_claimed_and_an_owned_one_stops_after_its_save(
    pg_dsn: str, tmp_path: Path, run_durably: Callable[..., Durably]
) -> None:
    """``durably cancel --dsn``: a queued run is saved as cancelled and no worker claims it;
    a run a worker is inside a tool of is asked, finishes that call, and ends cancelled at
    the save of its result: its later calls never act. A pruning worker then removes both.
    """
    submit_runs(pg_dsn, ["q1"])
    queued = run_durably("cancel", "q1", dsn=pg_dsn)
    assert queued.finish() == 0, queued.output
    assert "cancelled q1: nobody held it" in queued.output
    submit_runs(pg_dsn, ["s1"])
    (tmp_path / "pause").write_text("note")  # s1 waits inside its first note
    worker = start_worker(run_durably, pg_dsn, "--concurrency", "2")
    worker.wait_for(lambda: (tmp_path / "acted").exists(), what="the first note acted")
    owned = run_durably("cancel", "s1", dsn=pg_dsn)
    assert owned.finish() == 0, owned.output
    assert "asked the owner of s1 to stop" in owned.output
    (tmp_path / "pause").unlink()
    worker.wait_for(lambda: phases(pg_dsn).get("s1") == "cancelled", what="s1 cancelled")
    assert worker.stop() == 0, worker.output
    assert "1 claimed" in worker.output, worker.output
    assert "1 cancelled" in worker.output, worker.output
    assert phases(pg_dsn) == {"q1": "cancelled", "s1": "cancelled"}
    effects = sorted((e["run_id"], e["call_id"]) for e in Ledger(tmp_path).effects())
    assert effects == [("s1", "c1"), ("s1", "n1")]
    pruner = start_worker(run_durably, pg_dsn, "--prune-done-older-than", "0s")
    pruner.wait_for(pruner.said(r"pruned 2 finished run"), what="the prune")
    assert pruner.stop() == 0, pruner.output
    assert phases(pg_dsn) == {}
