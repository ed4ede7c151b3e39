"""Cancel and prune on the Postgres store (issue 38, item 3): owned, lapsed, queued, killed.

The worker tests are in test_pg_fleet.py (a queued run cancelled is never claimed; an
owned run ends cancelled after its current save); these hold the store's own rules,
and a prune SIGKILLed mid-way.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from _pg_procs import Child
from _pg_sql import sql

import durably
from _helpers.patience import stretched
from _helpers.samples import state_a
from durably.postgres import PostgresStore, housekeeping, submit
from durably.state import AssistantMessage, Phase, RunState
from durably.stores import CancelOutcome, Housekeeping

pytestmark = pytest.mark.postgres

PATIENCE_S = stretched(60)


def run(dsn: str, scenario: Callable[[PostgresStore], Awaitable[Any]]) -> Any:
    """``scenario(store)`` on a store of ``dsn``, in an event loop of its own."""

    async def main() -> Any:
        async with PostgresStore(dsn, lease=timedelta(seconds=30)) as store:
            return await scenario(store)

    return asyncio.run(main())


def finished(run_id: str) -> RunState:
    """A run that answered after one reply (two saves: the start and the reply)."""
    state = state_a(run_id)
    state.messages.append(AssistantMessage(text="done", turn=1))
    state.turns = 1
    state.phase = Phase.DONE
    state.answer = "done"
    return state


async def make_finished(store: PostgresStore, run_ids: list[str]) -> None:
    """Create each run, save its answer as a change (a row of durably_changes), close it."""
    for run_id in run_ids:
        handle = await store.create(state_a(run_id))
        await handle.save(finished(run_id))
        await handle.close()


def test_the_postgres_store_offers_housekeeping(pg_dsn: str) -> None:
    """PostgresStore is a Housekeeping store (what `durably cancel --dsn` asks of it)."""
    assert isinstance(PostgresStore(pg_dsn), Housekeeping)


def test_an_owned_run_is_asked_and_its_owner_learns_it_from_its_next_save(pg_dsn: str) -> None:
    """A run a live lease holds is only asked to stop: the row keeps its phase and owner,
    and the handle says so after its next save (the save's own statement returned it).
    """

    async def scenario(store: PostgresStore) -> None:
        handle = await store.create(state_a("r1"))
        async with PostgresStore(pg_dsn) as other:
            assert await other.cancel("r1") is CancelOutcome.REQUESTED
        assert not handle.cancel_requested()  # nothing saved since: nothing learned
        state = state_a("r1")
        state.turns = 1
        await handle.save(state)
        assert handle.cancel_requested()
        assert (await store.read("r1")).phase is Phase.MODEL
        await handle.close()

    run(pg_dsn, scenario)
    assert sql(pg_dsn, "SELECT phase, cancel_requested IS NOT NULL FROM durably_runs") == [
        ("model", True)
    ]


def test_a_run_whose_owner_died_is_cancelled_at_once_and_fenced(pg_dsn: str) -> None:
    """A lapsed lease's run is saved as cancelled in the cancel's transaction, its token
    moved on: the old owner's save is refused, and the state reads as cancelled.
    """

    async def scenario(store: PostgresStore) -> None:
        handle = await store.create(state_a("r1"))
        before = handle.token
        sql(pg_dsn, "UPDATE durably_runs SET expires_at = now() - interval '1 second'")
        async with PostgresStore(pg_dsn) as other:
            assert await other.cancel("r1") is CancelOutcome.CANCELLED
            assert await other.cancel("r1") is CancelOutcome.FINISHED
        state = await store.read("r1")
        assert (state.phase, state.stop_reason) == (Phase.CANCELLED, "cancelled")
        with pytest.raises(durably.LeaseLost):
            await handle.save(state_a("r1"))
        await handle.close()
        ((token,),) = sql(pg_dsn, "SELECT token FROM durably_runs WHERE run_id = 'r1'")
        assert token == before + 1

    run(pg_dsn, scenario)


def test_a_queued_run_is_cancelled_with_a_state_and_never_claimed(pg_dsn: str) -> None:
    """A submitted run nobody started becomes a cancelled run with its task as its state;
    a claim for its agent finds nothing.
    """

    async def scenario(store: PostgresStore) -> None:
        await submit(store, agent_name="ledger", task="settle", run_id="q1")
        assert await store.cancel("q1") is CancelOutcome.CANCELLED
        state = await store.read("q1")
        assert (state.phase, state.task, state.turns) == (Phase.CANCELLED, "settle", 0)
        from durably.postgres import queue

        assert await queue.claim(store, agents=["ledger"], limit=5) == []

    run(pg_dsn, scenario)


def test_cancel_of_a_missing_run_says_so(pg_dsn: str) -> None:
    """No such run: RunNotFound, nothing written."""

    async def scenario(store: PostgresStore) -> None:
        with pytest.raises(durably.RunNotFound):
            await store.cancel("nope")

    run(pg_dsn, scenario)


def test_prune_takes_finished_runs_old_enough_and_free_with_their_changes(pg_dsn: str) -> None:
    """Done and cancelled runs saved before the cutoff go with their changes; a recent one,
    an unfinished old one and a finished one a live lease still holds stay.
    """

    async def scenario(store: PostgresStore) -> Any:
        await make_finished(store, ["old-done", "recent-done"])
        held = await store.create(state_a("old-held"))
        await held.save(finished("old-held"))
        unfinished = await store.create(state_a("old-running"))
        await unfinished.close()
        await submit(store, agent_name="ledger", task="settle", run_id="old-queued")
        await store.cancel("old-queued")
        sql(
            pg_dsn,
            "UPDATE durably_runs SET saved_at = now() - interval '40 days' "
            "WHERE run_id LIKE 'old-%%'",
        )
        report = await store.prune(older_than=timedelta(days=30))
        await held.close()
        return report

    report = run(pg_dsn, scenario)
    assert report.pruned == ("old-done", "old-queued")
    assert report.owned == ("old-held",)
    assert sorted(r for (r,) in sql(pg_dsn, "SELECT run_id FROM durably_runs")) == [
        "old-held",
        "old-running",
        "recent-done",
    ]
    assert sql(pg_dsn, "SELECT DISTINCT run_id FROM durably_changes ORDER BY 1") == [
        ("old-held",),
        ("recent-done",),
    ]


def whole_or_gone(dsn: str, run_ids: list[str]) -> tuple[list[str], list[str]]:
    """Every run either reads as its finished state or has no row and no change left."""

    async def check(store: PostgresStore) -> tuple[list[str], list[str]]:
        whole, gone = [], []
        present = {r for (r,) in sql(dsn, "SELECT run_id FROM durably_runs")}
        orphans = sql(
            dsn,
            "SELECT DISTINCT c.run_id FROM durably_changes c "
            "LEFT JOIN durably_runs r USING (run_id) WHERE r.run_id IS NULL",
        )
        assert orphans == [], f"changes of pruned runs were left: {orphans}"
        for run_id in run_ids:
            if run_id in present:
                state = await store.read(run_id)
                assert (state.phase, state.answer) == (Phase.DONE, "done")
                whole.append(run_id)
            else:
                gone.append(run_id)
        return whole, gone

    result: tuple[list[str], list[str]] = run(dsn, check)
    return result


def prune_killed(dsn: str, run_ids: list[str], kill: str) -> int:
    """Start a pruner of ``run_ids`` (ten a batch) and let it die as ``kill`` says; its status.

    ``kill`` is a crash point (``label@N``), or ``random``: a SIGKILL at a random moment
    of the first 50 ms after it starts pruning (about its whole run on a quiet machine).
    """
    run(dsn, lambda store: make_finished(store, run_ids))
    pruner = Child("prune", dsn, "30", "10", "" if kill == "random" else kill)
    try:
        assert pruner.line(timeout=PATIENCE_S) == "pruning"
        if kill == "random":
            time.sleep(random.uniform(0.0, 0.05))
            pruner.process.send_signal(signal.SIGKILL)
        return pruner.process.wait(timeout=PATIENCE_S)
    finally:
        pruner.kill()


@pytest.mark.parametrize("kill", ["postgres.prune.batch@2", "random"])
def test_a_prune_killed_mid_way_leaves_each_run_whole_or_gone(pg_dsn: str, kill: str) -> None:
    """A pruning process SIGKILLed after its second batch, or at a random moment, leaves
    every run whole (it reads) or gone (no row, no change); the next prune takes the rest.
    A random instant that falls after the prune finished is drawn again (up to ten times,
    each on new runs): the test judges a real kill.
    """
    for attempt in range(10):
        run_ids = [f"f{attempt}-{i:03d}" for i in range(120)]
        code = prune_killed(pg_dsn, run_ids, kill)
        if code == -signal.SIGKILL:
            break
        assert kill == "random", f"the pruner was not killed at {kill} (status {code})"
        assert sql(pg_dsn, "SELECT count(*) FROM durably_runs") == [(0,)], "it pruned all"
    else:
        pytest.fail("ten random instants all fell after the prune had finished")
    whole, gone = whole_or_gone(pg_dsn, run_ids)
    if kill != "random":
        assert len(gone) == 20, "two batches of ten, each deleted whole"
    assert sorted(whole + gone) == run_ids
    report = run(
        pg_dsn,
        lambda store: housekeeping.prune(store, older_than=timedelta(0), batch=10),
    )
    assert sorted(report.pruned) == whole
    assert sql(pg_dsn, "SELECT count(*) FROM durably_runs") == [(0,)]
    assert sql(pg_dsn, "SELECT count(*) FROM durably_changes") == [(0,)]
