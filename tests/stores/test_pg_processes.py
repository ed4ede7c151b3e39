"""Postgres leases between real processes: exclusion, expiry after a crash, and fencing."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from datetime import timedelta
from pathlib import Path

import pytest
from _pg_jobs import ANSWER, Ledger, make_agent
from _pg_procs import Child

import durably
from _helpers.samples import state_a, state_b, without_saved_at
from durably.postgres import PostgresStore
from durably.state import Phase, RunState

pytestmark = pytest.mark.postgres

LEASE = 1.5


def store(dsn: str, lease: float = LEASE) -> PostgresStore:
    """A Postgres store on ``dsn`` with a short lease, renewed four times per lease."""
    return PostgresStore(
        dsn, lease=timedelta(seconds=lease), renew_every=timedelta(seconds=lease / 4)
    )


def create(dsn: str, state: RunState) -> None:
    """Create the run of ``state`` and close it at once."""

    async def main() -> None:
        async with store(dsn) as s:
            await (await s.create(state)).close()

    asyncio.run(main())


def read(dsn: str, run_id: str) -> RunState:
    """Read a run's state without taking its lease."""

    async def main() -> RunState:
        async with store(dsn) as s:
            return await s.read(run_id)

    return asyncio.run(main())


def take_over(stalled: Child, dsn: str, tmp_path: Path) -> durably.Outcome:
    """Once the stopped ``stalled`` agent's 1 s lease has run out, resume run r1 here to its
    end; then let ``stalled`` go on, and require that it stops on LeaseLost.
    """
    time.sleep(1.5)

    async def resume() -> durably.Outcome:
        async with store(dsn) as s:
            return await make_agent(tmp_path, s).resume("r1")

    outcome = asyncio.run(resume())
    os.kill(stalled.pid, signal.SIGCONT)
    assert stalled.json()["outcome"] == "lease-lost"
    return outcome


def test_a_second_process_is_locked_out_until_the_crashed_owners_lease_expires(
    pg_dsn: str,
) -> None:
    """While one process holds a run another gets Locked; after a SIGKILL it gets the run once
    the lease expires, with the next fencing token.
    """
    create(pg_dsn, state_a("r1"))
    holder = Child("hold", pg_dsn, str(LEASE), "r1")
    try:
        token = int(holder.line().split()[1])
        assert Child.ask("try-open", pg_dsn, str(LEASE), "r1") == {"outcome": "locked"}
        time.sleep(LEASE * 1.5)  # the holder's renewals keep its lease past its length
        assert Child.ask("try-open", pg_dsn, str(LEASE), "r1") == {"outcome": "locked"}
        holder.kill()
        killed = time.monotonic()

        async def right_after() -> None:
            async with store(pg_dsn) as s:
                with pytest.raises(durably.Locked):
                    await s.open("r1")

        asyncio.run(right_after())
        while True:
            answer = Child.ask("try-open", pg_dsn, str(LEASE), "r1")
            if answer["outcome"] == "opened":
                break
            assert time.monotonic() - killed < LEASE + 10
        assert answer["token"] == token + 1
    finally:
        holder.kill()


def test_a_stalled_owner_is_fenced_off_and_writes_nothing(pg_dsn: str) -> None:
    """A process stopped past its lease loses the run to another; its next save is LeaseLost and
    the new owner's state stays.
    """
    create(pg_dsn, state_a("r1"))
    stalled = Child("hold", pg_dsn, "1.0", "r1")
    try:
        old_token = int(stalled.line().split()[1])
        os.kill(stalled.pid, signal.SIGSTOP)
        time.sleep(1.5)
        newer = state_a("r1")
        newer.turns = 7

        async def take_over() -> None:
            async with store(pg_dsn, lease=30) as s:
                handle, _ = await s.open("r1")
                assert handle.token == old_token + 1
                await handle.save(newer)
                os.kill(stalled.pid, signal.SIGCONT)
                await asyncio.to_thread(stalled.send, "save")
                assert await asyncio.to_thread(stalled.line) == "lease-lost"
                await handle.save(newer)  # the new owner carries on undisturbed
                await handle.close()

        asyncio.run(take_over())
        assert stalled.finish() == 0
    finally:
        stalled.kill()
    assert without_saved_at(read(pg_dsn, "r1")) == without_saved_at(newer)


def test_a_call_in_flight_in_a_fenced_process_is_resolved_by_the_new_owner(
    pg_dsn: str, tmp_path: Path
) -> None:
    """A write in flight when its process stalled is an in-doubt call for the next owner, whose
    ladder finds it by lookup; the stalled process then stops on LeaseLost, and the write
    happened once.
    """
    (tmp_path / "pause").write_text("note")
    stalled = Child("agent", pg_dsn, "1.0", "r1", str(tmp_path))
    try:
        wait_for(tmp_path / "acted")
        os.kill(stalled.pid, signal.SIGSTOP)
        (tmp_path / "pause").unlink()
        in_doubt = read(pg_dsn, "r1")
        assert list(in_doubt.markers) == ["n1"]
        outcome = take_over(stalled, pg_dsn, tmp_path)
    finally:
        stalled.kill()
    assert outcome.status == "done"
    assert outcome.answer == ANSWER
    assert outcome.state.resolutions["n1"].step == 2
    assert outcome.state.resolutions["n1"].outcome == "found"
    effects = [(e["tool"], e["call_id"]) for e in Ledger(tmp_path).effects()]
    assert sorted(effects) == [("credit", "c1"), ("credit", "c2"), ("note", "n1"), ("note", "n2")]
    final = read(pg_dsn, "r1")
    assert final.phase is Phase.DONE
    assert without_saved_at(final) == without_saved_at(outcome.state)


def test_a_stale_write_is_refused_by_a_receiver_that_checks_the_fencing_token(
    pg_dsn: str, tmp_path: Path
) -> None:
    """A process stalled after its attempt save but before its write loses the run; the new
    owner's lookup finds nothing and writes; the stalled write, carrying the old token,
    is refused by the receiver, and the stalled process stops on LeaseLost.
    """
    (tmp_path / "pause").write_text("note:before")
    stalled = Child("agent", pg_dsn, "1.0", "r1", str(tmp_path))
    try:
        wait_for(tmp_path / "waiting")
        os.kill(stalled.pid, signal.SIGSTOP)
        (tmp_path / "pause").unlink()
        outcome = take_over(stalled, pg_dsn, tmp_path)
    finally:
        stalled.kill()
    assert outcome.status == "done"
    assert outcome.state.resolutions["n1"].outcome == "not-found"
    ledger = Ledger(tmp_path)
    assert [(e["call_id"], e["token"]) for e in ledger.effects("note")] == [("n1", 2), ("n2", 2)]
    assert [(e["call_id"], e["token"]) for e in ledger.entries() if e["kind"] == "fenced"] == [
        ("n1", 1)
    ]


def wait_for(path: Path, timeout: float = 30) -> None:
    """Wait until a child writes the file at ``path``."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)


def test_a_save_in_one_process_is_what_another_reads(pg_dsn: str) -> None:
    """A state saved by the process holding the run is what a reader in another process gets."""
    create(pg_dsn, state_a("r1"))
    holder = Child("hold", pg_dsn, str(LEASE), "r1")
    try:
        holder.line()
        holder.send("save")
        assert holder.line() == "saved"
        assert holder.finish() == 0
    finally:
        holder.kill()
    assert without_saved_at(read(pg_dsn, "r1")) == state_b("r1")
