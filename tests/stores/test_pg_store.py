"""The Postgres store's own rules: schema, leases, fencing tokens, renewal, the database clock."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from _pg_sql import run, sql

import durably
from _helpers.patience import stretched
from _helpers.samples import state_a, state_b, without_saved_at
from durably.postgres import MIGRATIONS, PostgresStore, current_lease, submit
from durably.postgres import store as postgres

pytestmark = pytest.mark.postgres


def test_importing_durably_does_not_import_psycopg() -> None:
    """``import durably`` and importing the Postgres store module leave psycopg unimported."""
    code = (
        "import sys, durably, durably.postgres, durably.postgres.store; "
        "print(sorted(m for m in sys.modules if m.startswith('psycopg')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_schema_is_created_once_by_racing_stores(pg_dsn: str) -> None:
    """Stores starting at once migrate the schema once: one version row per migration."""

    async def main() -> None:
        stores = [PostgresStore(pg_dsn) for _ in range(6)]
        try:
            versions = await asyncio.gather(*(s.migrate() for s in stores))
        finally:
            for store in stores:
                await store.close()
        assert versions == [MIGRATIONS[-1].version] * 6

    asyncio.run(main())
    rows = sql(pg_dsn, "SELECT version, description FROM durably_schema ORDER BY version")
    assert rows == [(m.version, m.description) for m in MIGRATIONS]
    columns = {
        r[0]
        for r in sql(
            pg_dsn,
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'durably_runs'",
        )
    }
    assert {"run_id", "state", "owner", "token", "expires_at", "agent", "parked"} <= columns


def test_a_schema_newer_than_the_code_is_refused(pg_dsn: str) -> None:
    """A database migrated by a newer durably is CheckpointTooNew, and nothing is changed."""
    run(pg_dsn, lambda store: store.migrate())
    newer = MIGRATIONS[-1].version + 1
    sql(pg_dsn, "INSERT INTO durably_schema (version, description) VALUES (%s, 'future')", newer)
    with pytest.raises(durably.CheckpointTooNew) as caught:
        run(pg_dsn, lambda store: store.list_runs())
    assert caught.value.found == newer


def test_the_fencing_token_grows_with_every_acquisition(pg_dsn: str) -> None:
    """``create`` takes token 1 and every later open the next one, whoever opens."""

    async def scenario(store: PostgresStore) -> list[int]:
        tokens = []
        handle = await store.create(state_a("r1"))
        tokens.append(handle.token)
        await handle.close()
        for _ in range(3):
            handle, _ = await store.open("r1")
            tokens.append(handle.token)
            await handle.close()
        return tokens

    async def from_another_store(store: PostgresStore) -> int:
        handle, _ = await store.open("r1")
        await handle.close()
        return handle.token

    assert run(pg_dsn, scenario) == [1, 2, 3, 4]
    assert run(pg_dsn, from_another_store) == 5


def test_a_save_under_a_taken_over_lease_is_lease_lost_and_writes_nothing(pg_dsn: str) -> None:
    """A handle whose lease lapsed and was taken over gets LeaseLost on save; the new owner's
    state stays, and the store counts the stale save.
    """

    async def scenario(store: PostgresStore) -> None:
        stale = await store.create(state_a("r1"))
        stale.keeper.renewal.cancel()  # a stall: no renewals from here on
        await asyncio.sleep(1.2)
        async with PostgresStore(pg_dsn, lease=timedelta(seconds=30)) as other:
            fresh, _ = await other.open("r1")
            await fresh.save(state_b("r1"))
            with pytest.raises(durably.LeaseLost) as caught:
                await stale.save(state_a("r1"))
            assert caught.value.token == stale.token == fresh.token - 1
            assert store.stats.stale_saves == 1
            assert without_saved_at(await other.read("r1")) == state_b("r1")
            with pytest.raises(durably.LeaseLost):
                await stale.save(state_a("r1"))  # and it stays lost
            await stale.close()  # frees nothing: the lease is the new owner's
            with pytest.raises(durably.Locked):
                await store.open("r1")
            await fresh.close()

    run(pg_dsn, scenario, lease=1.0)


def test_a_lapsed_lease_refuses_saves_even_if_nobody_took_it(pg_dsn: str) -> None:
    """A save after the lease ran out is LeaseLost even when no other process opened the run."""

    async def scenario(store: PostgresStore) -> None:
        handle = await store.create(state_a("r1"))
        handle.keeper.renewal.cancel()  # a stall: no renewals
        # Make the local deadline look fresh, so the database alone decides.
        await asyncio.sleep(1.2)
        handle.keeper.deadline = time.monotonic() + 60  # a stall: no renewals
        with pytest.raises(durably.LeaseLost):
            await handle.save(state_b("r1"))
        assert without_saved_at(await store.read("r1")) == state_a("r1")
        await handle.close()

    run(pg_dsn, scenario, lease=1.0)


def test_renewal_keeps_a_lease_for_as_long_as_the_run_is_open(pg_dsn: str) -> None:
    """An open handle keeps its run for many lease lengths, and saves all along."""
    # Long enough that a loaded machine's late wake-ups fit in a period: the test is of
    # the lease kept, not of how short a lease this machine can keep.
    lease = stretched(0.6)

    async def scenario(store: PostgresStore) -> None:
        handle = await store.create(state_a("r1"))
        async with PostgresStore(pg_dsn) as other:
            for _ in range(4):
                await asyncio.sleep(lease * 0.8)
                with pytest.raises(durably.Locked):
                    await other.open("r1")
                await handle.save(state_b("r1"))
        # Held for 3.2 lease lengths: only renewals (saves do not renew) can have done it.
        assert store.stats.renewals >= 3
        await handle.close()

    run(pg_dsn, scenario, lease=lease)


def test_a_renewal_that_finds_the_lease_taken_stops_the_next_save(pg_dsn: str) -> None:
    """When a renewal finds another token, the handle is lost and its next save raises
    LeaseLost without touching the database.
    """

    async def scenario(store: PostgresStore) -> None:
        handle = await store.create(state_a("r1"))
        sql(pg_dsn, "UPDATE durably_runs SET token = token + 1, owner = 'thief'")
        for _ in range(50):
            if handle.lost:
                break
            await asyncio.sleep(0.05)
        assert handle.lost is not None
        saves = store.stats.saves
        with pytest.raises(durably.LeaseLost):
            await handle.save(state_b("r1"))
        assert store.stats.saves == saves
        await handle.close()

    run(pg_dsn, scenario, lease=1.0)
    assert sql(pg_dsn, "SELECT owner FROM durably_runs") == [("thief",)]


def test_the_leases_of_one_store_are_renewed_together_and_a_taken_one_alone_is_lost(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twenty open runs of one store renew in two statements a period at most, not twenty; a
    run taken over meanwhile is lost to its handle, and the nineteen others are kept.
    """
    from durably.postgres import _lease

    batches: list[int] = []
    send = _lease.Renewals._send  # noqa: SLF001 -- counting the statements renewals send

    async def counted(self: _lease.Renewals, due: list[Any]) -> None:
        batches.append(len(due))
        await send(self, due)

    monkeypatch.setattr(_lease.Renewals, "_send", counted)
    runs = [f"r{n:02d}" for n in range(20)]

    async def scenario(store: PostgresStore) -> None:
        handles = [await store.create(state_a(run_id)) for run_id in runs]
        batches.clear()
        renewals = store.stats.renewals
        await asyncio.sleep(4 * store.renew_every.total_seconds())
        # Each period's renewals went together: in two cohorts at most (the grid's
        # instants are half a period apart, and the runs were made across one of them).
        periods = (store.stats.renewals - renewals) / 20
        assert periods >= 3
        assert sum(batches) == store.stats.renewals - renewals
        assert max(batches) >= 10
        assert len(batches) <= 2 * periods + 2
        sql(pg_dsn, "UPDATE durably_runs SET token = token + 1 WHERE run_id = 'r07'")
        for _ in range(100):
            if handles[7].lost:
                break
            await asyncio.sleep(0.05)
        assert handles[7].lost is not None
        with pytest.raises(durably.LeaseLost):
            await handles[7].save(state_b("r07"))
        await asyncio.sleep(4 * store.renew_every.total_seconds())  # well past one lease
        for handle in handles[:7] + handles[8:]:
            assert handle.lost is None
            await handle.save(state_b(handle.run_id))
        for handle in handles:
            await handle.close()

    run(pg_dsn, scenario, lease=1.2)


def test_a_first_renewal_comes_between_half_a_period_and_a_period_on_the_stores_grid(
    pg_dsn: str,
) -> None:
    """Whenever a lease is taken, its first renewal is due half a period to a period later,
    at an instant of a grid half a period apart that every keeper of the store shares.
    """

    async def scenario(store: PostgresStore) -> None:
        handle = await store.create(state_a("r1"))
        every = store.renew_every.total_seconds()
        for step in range(200):
            now = 1000.0 + step * every / 37
            due = handle.keeper.first_renewal(now)
            assert every / 2 <= due - now <= every + 1e-9
            assert abs(due / (every / 2) - round(due / (every / 2))) < 1e-9
        await handle.close()

    run(pg_dsn, scenario, lease=1.2)


def test_renewals_stay_a_period_apart_on_the_grid_however_late_one_woke(pg_dsn: str) -> None:
    """A renewal sent on time is followed a period later; one sent late (a loaded machine)
    is followed within a period of when it was sent, on the grid, never further off.
    """

    async def scenario(store: PostgresStore) -> None:
        handle = await store.create(state_a("r1"))
        keeper, every = handle.keeper, store.renew_every.total_seconds()
        due = keeper.first_renewal(1000.0)
        assert keeper.next_renewal(due, due) == pytest.approx(due + every)
        for step in range(1, 120):
            sent = due + step * every / 29  # up to four periods late
            after = keeper.next_renewal(due, sent)
            assert every / 2 - 1e-9 <= after - sent <= every + 1e-9
            assert abs(after / (every / 2) - round(after / (every / 2))) < 1e-9
        await handle.close()

    run(pg_dsn, scenario, lease=1.2)


def test_close_frees_the_lease_for_another_owner_at_once(pg_dsn: str) -> None:
    """After close another store opens the run immediately; the lease row says it is free."""

    async def scenario(store: PostgresStore) -> int:
        await (await store.create(state_a("r1"))).close()
        assert sql(pg_dsn, "SELECT expires_at FROM durably_runs") == [(None,)]
        async with PostgresStore(pg_dsn, owner="second") as other:
            handle, _ = await other.open("r1")
            await handle.close()
            return handle.token

    assert run(pg_dsn, scenario) == 2


def test_a_dropped_connection_is_retried_transparently(pg_dsn: str) -> None:
    """A save after the server killed the store's connections succeeds on a new connection."""

    async def scenario(store: PostgresStore) -> None:
        handle = await store.create(state_a("r1"))
        sql(
            pg_dsn,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'durably' AND pid <> pg_backend_pid()",
        )
        await handle.save(state_b("r1"))
        assert store.stats.retries >= 1
        assert without_saved_at(await store.read("r1")) == state_b("r1")
        await handle.close()

    run(pg_dsn, scenario)


def test_with_stamina_inactive_a_dropped_connection_fails_the_save_at_once(pg_dsn: str) -> None:
    """stamina.set_active(False) turns the store's retries off: the first failure is SaveFailed."""
    import stamina

    async def scenario(store: PostgresStore) -> None:
        handle = await store.create(state_a("r1"))
        sql(
            pg_dsn,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'durably' AND pid <> pg_backend_pid()",
        )
        stamina.set_active(False)
        try:
            with pytest.raises(durably.SaveFailed, match="could not be reached"):
                await handle.save(state_b("r1"))
        finally:
            stamina.set_active(True)
        assert store.stats.retries == 0
        assert without_saved_at(await store.read("r1")) == state_a("r1")
        await handle.close()

    run(pg_dsn, scenario)


def test_the_lease_expiry_is_the_database_clock_not_the_process_clock(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process whose clock is hours off takes, keeps and loses leases exactly when the
    database says: its clock changes nothing.
    """
    real_time = time.time

    def skewed(hours: float) -> None:
        monkeypatch.setattr(time, "time", lambda: real_time() + hours * 3600)
        monkeypatch.setattr(postgres, "utcnow", lambda: datetime.now(UTC) + timedelta(hours=hours))

    async def scenario(store: PostgresStore) -> None:
        skewed(+5)  # the owner's clock runs far ahead: its lease must not look expired
        handle = await store.create(state_a("r1"))
        (remaining,) = sql(
            pg_dsn, "SELECT extract(epoch FROM expires_at - now()) FROM durably_runs"
        )[0]
        assert 0.5 < float(remaining) <= 1.0
        skewed(-5)  # a rival's clock runs far behind: a lapsed lease must not look live
        async with PostgresStore(pg_dsn, lease=timedelta(seconds=1)) as rival:
            with pytest.raises(durably.Locked):
                await rival.open("r1")
            handle.keeper.renewal.cancel()  # a stall: no renewals
            await asyncio.sleep(1.2)
            taken, _ = await rival.open("r1")
            skewed(+5)
            with pytest.raises(durably.LeaseLost):
                await handle.save(state_b("r1"))
            await taken.close()
        await handle.close()

    run(pg_dsn, scenario, lease=1.0)


def test_the_current_lease_is_visible_to_the_task_that_opened_the_run(pg_dsn: str) -> None:
    """After open, current_lease() names the run and its token; after close it is gone."""

    async def scenario(store: PostgresStore) -> None:
        await (await store.create(state_a("r1"))).close()
        handle, _ = await store.open("r1")
        lease = current_lease()
        assert lease is not None
        assert (lease.run_id, lease.token, lease.owner) == ("r1", 2, store.owner)
        await handle.close()
        assert current_lease() is None

    run(pg_dsn, scenario)


def test_a_submitted_run_is_queued_for_a_worker(pg_dsn: str) -> None:
    """A submitted run has no state yet: open and read say so, list_runs skips it, and its ID
    is taken.
    """

    async def scenario(store: PostgresStore) -> None:
        run_id = await submit(store, agent_name="ledger", task="settle", run_id="q1")
        assert run_id == "q1"
        with pytest.raises(durably.RunNotFound, match="queued"):
            await store.open("q1")
        with pytest.raises(durably.RunNotFound, match="queued"):
            await store.read("q1")
        assert await store.list_runs() == []
        with pytest.raises(durably.RunExists):
            await submit(store, agent_name="ledger", task="settle", run_id="q1")
        with pytest.raises(durably.RunExists):
            await store.create(state_a("q1"))

    run(pg_dsn, scenario)
    assert sql(pg_dsn, "SELECT phase, agent, task, state FROM durably_runs") == [
        ("queued", "ledger", "settle", None)
    ]


def test_a_locked_run_names_its_owner_and_the_database_expiry(pg_dsn: str) -> None:
    """Locked from the Postgres store says who holds the lease and until when, database time."""

    async def scenario(store: PostgresStore) -> str:
        handle = await store.create(state_a("r1"))
        async with PostgresStore(pg_dsn) as other:
            with pytest.raises(durably.Locked) as caught:
                await other.open("r1")
        await handle.close()
        return caught.value.path

    message = run(pg_dsn, scenario, owner="worker-7")
    assert "worker-7" in message
    assert "r1" in message
    assert "lease" in str(caught_message(pg_dsn))


def caught_message(pg_dsn: str) -> str:
    """The whole Locked message a second opener gets from a live lease."""

    async def scenario(store: PostgresStore) -> str:
        handle = await store.create(state_a("r2"))
        async with PostgresStore(pg_dsn) as other:
            with pytest.raises(durably.Locked) as caught:
                await other.open("r2")
        await handle.close()
        return str(caught.value)

    return run(pg_dsn, scenario)


def test_an_unreachable_database_is_store_unavailable_not_a_driver_error() -> None:
    """Reading from a database nobody answers for is StoreUnavailable, naming the place."""

    async def scenario() -> None:
        dsn = "postgresql://postgres@127.0.0.1:9/nowhere?connect_timeout=1"
        store = PostgresStore(dsn, lease=timedelta(seconds=1))
        try:
            with pytest.raises(durably.StoreUnavailable, match="could not be reached"):
                await store.read("r1")
        finally:
            await store.close()

    asyncio.run(scenario())
