"""Group commit: saves of several runs in one statement, each with its own outcome."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import pytest
from _pg_procs import Child

import durably
from _helpers.samples import state_a, state_b, without_saved_at
from durably.postgres import PostgresRun, PostgresStore, _groupcommit, _sql
from durably.state import Phase, RunState

pytestmark = pytest.mark.postgres

RUNS = ("r1", "r2", "r3", "r4", "r5")
"""Saved at once, the first two go alone (two statements in flight, see
:func:`two_in_flight`) and the other three wait and go together in one statement."""


@pytest.fixture(autouse=True)
def two_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two save statements in flight at most, so five runs saving at once make a group."""
    monkeypatch.setattr(_groupcommit, "SAVES_IN_FLIGHT", 2)


def store(dsn: str) -> PostgresStore:
    """A store whose leases outlast the test: nothing expires unless a test says so."""
    return PostgresStore(dsn, lease=timedelta(seconds=60))


async def create_all(s: PostgresStore) -> list[PostgresRun]:
    """Every run of :data:`RUNS`, created with state A and held by ``s``."""
    return [await s.create(state_a(run_id)) for run_id in RUNS]


async def saved(s: PostgresStore, run_id: str) -> RunState:
    """The run's stored state, without its save time."""
    return without_saved_at(await s.read(run_id))


def test_a_group_mixing_a_fenced_run_and_live_ones_lands_only_the_live_ones(
    pg_dsn: str,
) -> None:
    """In one group statement from another process, the row of a run taken over since is
    refused by the database (that process gets LeaseLost for it alone) and the live rows land.
    """

    async def make() -> None:
        async with store(pg_dsn) as s:
            for handle in await create_all(s):
                await handle.close()

    asyncio.run(make())
    holder = Child("hold-many", pg_dsn, "60", *RUNS)
    try:
        tokens = holder.json()["tokens"]
        newer = state_a("r4")
        newer.turns = 7

        async def take_over_r4_and_let_the_holder_save() -> dict[str, object]:
            async with store(pg_dsn) as mine:
                # r4's lease runs out in the database while the holder's handle still
                # believes it (its renewals are 15 s apart), and this process takes it.
                await mine.execute(
                    lambda conn: conn.execute(
                        "UPDATE durably_runs SET expires_at = now() - interval '1 second' "
                        "WHERE run_id = 'r4'"
                    ),
                    what="expiring r4",
                )
                fresh, _ = await mine.open("r4")
                await fresh.save(newer)
                await asyncio.to_thread(holder.send, "save")
                answer = await asyncio.to_thread(holder.json)
                assert await saved(mine, "r4") == without_saved_at(newer)
                await fresh.close()
                assert fresh.token == tokens["r4"] + 1
                return answer

        answer = asyncio.run(take_over_r4_and_let_the_holder_save())
        assert holder.finish() == 0
    finally:
        holder.kill()
    assert answer["grouped"] == 3, "r3, r4 and r5 were meant to share one statement"
    assert answer["outcomes"] == {
        "r1": "saved",
        "r2": "saved",
        "r3": "saved",
        "r4": "lease-lost",
        "r5": "saved",
    }

    async def check() -> None:
        async with store(pg_dsn) as s:
            for run_id in ("r1", "r2", "r3", "r5"):
                assert await saved(s, run_id) == state_b(run_id)
            assert await saved(s, "r4") == without_saved_at(newer)

    asyncio.run(check())


@pytest.mark.parametrize(
    ("broken", "level"),
    [
        pytest.param(
            "SELECT pg_terminate_backend(pg_backend_pid()), %(run_ids)s::text[]",
            logging.INFO,
            id="its connection breaks",
        ),
        pytest.param("SELECT no_such_function(%(run_ids)s)", logging.WARNING, id="it is refused"),
    ],
)
def test_a_group_whose_statement_fails_sends_each_save_again_alone(
    pg_dsn: str,
    broken: str,
    level: int,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """When a group's statement fails as a whole, each of its saves is sent again alone and
    lands, and the failure is logged (a warning unless the connection broke).
    """
    monkeypatch.setattr(_sql, "SAVE_MANY", broken)

    async def scenario() -> None:
        async with store(pg_dsn) as s:
            handles = await create_all(s)
            with caplog.at_level(logging.INFO, logger="durably.store"):
                await asyncio.gather(*(h.save(state_b(h.run_id)) for h in handles))
            assert s.stats.grouped == 0
            assert s.stats.saves == len(RUNS)
            for run_id in RUNS:
                assert await saved(s, run_id) == state_b(run_id)
            for handle in handles:
                await handle.close()

    asyncio.run(scenario())
    failures = [r for r in caplog.records if "each is sent again alone" in r.getMessage()]
    assert [(r.levelno, "saving 3 runs" in r.getMessage()) for r in failures] == [(level, True)]


def test_a_save_cancelled_while_waiting_for_its_group_is_never_sent(pg_dsn: str) -> None:
    """A save cancelled before its group left writes nothing; the rest of the group lands and
    the cancelled handle saves again normally.
    """

    async def scenario() -> None:
        async with store(pg_dsn) as s:
            handles = await create_all(s)
            tasks = [asyncio.create_task(h.save(state_b(h.run_id))) for h in handles]
            await asyncio.sleep(0)  # each task has run up to its statement or its wait
            assert len(s._group._waiting) == 3  # noqa: SLF001 -- r3, r4, r5 wait for a place in flight
            tasks[3].cancel()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            assert [type(o).__name__ for o in outcomes] == [
                "NoneType",
                "NoneType",
                "NoneType",
                "CancelledError",
                "NoneType",
            ]
            assert s.stats.grouped == 2
            assert await saved(s, "r4") == state_a("r4")
            for run_id in ("r1", "r2", "r3", "r5"):
                assert await saved(s, run_id) == state_b(run_id)
            await handles[3].save(state_b("r4"))
            assert await saved(s, "r4") == state_b("r4")
            for handle in handles:
                await handle.close()

    asyncio.run(scenario())


def test_two_waiting_saves_of_one_run_go_in_turn_and_the_later_one_stays(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two saves of one run waiting together go in separate statements, the later one only
    after the earlier one's statement ended, so the run ends with the later state.
    """
    # The group statement (r3, r4 and the first r5) takes its time, so a second r5 sent
    # beside it instead of after it would land first and be overwritten.
    real = _sql.SAVE_MANY  # the group statement, slowed down below
    slow = real.replace("FROM unnest(", "FROM (SELECT pg_sleep(0.2)) AS pause, unnest(")
    assert slow != real
    monkeypatch.setattr(_sql, "SAVE_MANY", slow)

    async def scenario() -> None:
        async with store(pg_dsn) as s:
            handles = await create_all(s)
            later = state_b("r5")
            later.turns = 9
            await asyncio.gather(
                *(h.save(state_b(h.run_id)) for h in handles), handles[4].save(later)
            )
            assert await saved(s, "r5") == without_saved_at(later)
            assert s.stats.grouped == 3
            for handle in handles:
                await handle.close()

    asyncio.run(scenario())


def test_a_lease_lost_in_a_group_stops_that_run_only(pg_dsn: str) -> None:
    """A run whose lease ran out in the database gets LeaseLost from its group and is lost;
    the other runs of the group saved, and their handles go on saving.
    """

    async def scenario() -> None:
        async with store(pg_dsn) as s:
            handles = await create_all(s)
            await s.execute(
                lambda conn: conn.execute(
                    "UPDATE durably_runs SET expires_at = now() - interval '1 second' "
                    "WHERE run_id = 'r3'"
                ),
                what="expiring r3",
            )
            outcomes = await asyncio.gather(
                *(h.save(state_b(h.run_id)) for h in handles), return_exceptions=True
            )
            assert [type(o).__name__ for o in outcomes] == [
                "NoneType",
                "NoneType",
                "LeaseLost",
                "NoneType",
                "NoneType",
            ]
            assert handles[2].lost == "a save found the lease taken over or expired"
            assert s.stats.grouped == 3
            assert s.stats.stale_saves == 1
            assert await saved(s, "r3") == state_a("r3")
            with pytest.raises(durably.LeaseLost):
                await handles[2].save(state_b("r3"))
            await handles[4].save(state_a("r5"))
            assert await saved(s, "r5") == state_a("r5")
            for handle in handles:
                await handle.close()

    asyncio.run(scenario())


def test_a_save_given_back_by_a_failed_group_lands_before_the_runs_next_save(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When a group fails and its saves go again alone, a later save of one of its runs waits
    for that run's lone save to end, so the run ends with the later state.
    """
    monkeypatch.setattr(_sql, "SAVE_MANY", "SELECT no_such_function(%(run_ids)s)")
    # A lone save of the earlier states (phase tools) takes its time, so the later r5
    # (phase done) sent beside r5's lone save instead of after it would be overwritten.
    for name in ("SAVE_CHANGE", "SAVE_STATE"):  # a lone save, of a change or a snapshot
        real = getattr(_sql, name)
        slow = real.replace(
            "WHERE run_id",
            "FROM (SELECT pg_sleep(CASE WHEN %(phase)s = 'tools' THEN 0.3 ELSE 0 END)) AS pause\n"
            "    WHERE run_id",
        )
        assert slow.count("pg_sleep") == 1
        monkeypatch.setattr(_sql, name, slow)

    async def scenario() -> None:
        async with store(pg_dsn) as s:
            handles = await create_all(s)
            later = state_b("r5")
            later.phase = Phase.DONE
            await asyncio.gather(
                *(h.save(state_b(h.run_id)) for h in handles), handles[4].save(later)
            )
            assert s.stats.grouped == 0
            assert s.stats.saves == len(RUNS) + 1
            assert await saved(s, "r5") == without_saved_at(later)
            for handle in handles:
                await handle.close()

    asyncio.run(scenario())


def test_a_small_pool_groups_saves_sooner(pg_dsn: str) -> None:
    """With a pool of three connections one save statement is in flight at a time (two stay
    free for renewals and reads), so of three runs saving at once the last two share one.
    """
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

    async def scenario() -> None:
        pool: AsyncConnectionPool[AsyncConnection[tuple[object, ...]]] = AsyncConnectionPool(
            pg_dsn, kwargs={"autocommit": True}, min_size=1, max_size=3, open=False
        )
        async with pool:
            s = PostgresStore(pool=pool, lease=timedelta(seconds=60))
            handles = [await s.create(state_a(run_id)) for run_id in RUNS[:3]]
            await asyncio.gather(*(h.save(state_b(h.run_id)) for h in handles))
            assert s.stats.grouped == 2
            for run_id in RUNS[:3]:
                assert await saved(s, run_id) == state_b(run_id)
            for handle in handles:
                await handle.close()

    asyncio.run(scenario())
