"""Fencing at the database: the save's own ``UPDATE`` refuses a stale token."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import psycopg
import pytest

import durably
from _helpers.samples import state_a, state_b, without_saved_at
from durably.postgres import PostgresStore

pytestmark = pytest.mark.postgres


def test_a_stale_handle_whose_deadline_looks_fresh_is_refused_by_the_database(
    pg_dsn: str,
) -> None:
    """A handle that still believes its lease is live, after the database gave the run to
    another owner, has its save refused by the database itself: LeaseLost, nothing written.
    """

    async def scenario() -> None:
        lease = timedelta(seconds=60)
        async with (
            PostgresStore(pg_dsn, lease=lease) as mine,
            PostgresStore(pg_dsn, lease=lease) as theirs,
        ):
            stale = await mine.create(state_a("r1"))
            stale.keeper.renewal.cancel()  # a stall: no renewals from here on
            # The database's lease runs out (the stall outlasted it) and another owner
            # takes the run over, while this handle's own deadline is still a minute away.
            async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
                await conn.execute(
                    "UPDATE durably_runs SET expires_at = now() - interval '1 second' "
                    "WHERE run_id = 'r1'"
                )
            fresh, _ = await theirs.open("r1")
            await fresh.save(state_b("r1"))
            assert stale.keeper.deadline > time.monotonic() + 30  # its local deadline still passes
            assert stale.lost is None

            with pytest.raises(durably.LeaseLost) as caught:
                await stale.save(state_a("r1"))

            # Refused by the statement the database ran, not by the client's clock.
            assert stale.lost == "a save found the lease taken over or expired"
            assert caught.value.token == stale.token == fresh.token - 1
            assert mine.stats.stale_saves == 1
            assert without_saved_at(await theirs.read("r1")) == state_b("r1")
            await stale.close()
            await fresh.close()

    asyncio.run(scenario())
