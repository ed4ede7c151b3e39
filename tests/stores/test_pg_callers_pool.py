"""A store on the caller's own pool works whatever the pool's connections are set up as.

Applications often open their pool with ``row_factory=dict_row``, or leave autocommit off.
Every statement the store sends reads its rows as tuples on a cursor of its own, and runs in
a transaction of its own when the connection is not in autocommit.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from _helpers.samples import state_a, state_b, without_saved_at
from durably.postgres import PostgresStore, fleet, queue, submit
from durably.state import Phase
from durably.stores import CancelOutcome

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "transactions"])
def test_a_store_on_a_pool_with_dict_rows_does_everything_a_store_does(
    pg_dsn: str, autocommit: bool
) -> None:
    """Migrate, create, save, open, read, list, submit, claim, heartbeat, cancel and prune on a
    pool whose connections hand out dict rows: every answer is what a store of its own gives.
    """

    async def scenario() -> None:
        pool: AsyncConnectionPool[AsyncConnection[Any]] = AsyncConnectionPool(
            pg_dsn,
            kwargs={"autocommit": autocommit, "row_factory": dict_row},
            min_size=1,
            max_size=4,
            open=False,
        )
        async with pool:
            store = PostgresStore(pool=pool, lease=timedelta(seconds=60))
            await store.migrate()
            run_id = f"dict-{autocommit}"
            handle = await store.create(state_a(run_id))
            await handle.save(state_b(run_id))
            await handle.close()
            again, state = await store.open(run_id)
            assert without_saved_at(state) == without_saved_at(state_b(run_id))
            await again.close()
            assert without_saved_at(await store.read(run_id)) == without_saved_at(state_b(run_id))
            assert run_id in await store.list_runs()
            listing = await store.summaries()
            assert run_id in {s.run_id for s in listing.summaries}
            assert not listing.unreadable

            queued = await submit(store, agent_name="ledger", task="settle", run_id=f"q-{run_id}")
            claims = await queue.claim(store, agents=["ledger"], limit=5)
            assert [c.run_id for c in claims] == [queued]
            await fleet.heartbeat(store, agents=["ledger"], concurrency=1, ttl=store.lease)
            assert [w.owner for w in await fleet.live_workers(store)] == [store.owner]
            await fleet.retire(store)
            for claim in claims:
                await claim.handle.close()

            assert await store.cancel(run_id) is CancelOutcome.CANCELLED
            assert (await store.read(run_id)).phase is Phase.CANCELLED
            report = await store.prune(older_than=timedelta(0))
            assert run_id in report.pruned

    asyncio.run(scenario())
