"""What keeping many leases costs a Postgres server: renewals together against one at a time.

A worker holding many runs renews every lease every period (``renew_every``). The store
sends the renewals that come due together in one statement (``_lease.Renewals``). This
opens ``--handles`` runs on one store of a throwaway cluster (``fsync=on``), waits a
period, then counts over ``--periods`` periods: the renewals the store made, the
renewal statements it sent, the transactions the server committed
(``pg_stat_database.xact_commit``, which also counts the server's own background
work), and the server's and this process's CPU (``/proc``, ``time.process_time``).

The baseline, measured in the same run: the same store with each renewal sent in a
statement of its own (what the store did before), the two alternating ``--repeat``
times. Prints each round, then the medians and the ratio of batched to one at a time.

Run: ``.venv/bin/python benchmarks/renewals.py [--handles 200] [--periods 10]
[--every 0.5] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "stores"))
from _pg_cluster import Cluster
from _pgproc import postmaster_pid, server_cpu

from _helpers.samples import state_a
from durably.postgres import PostgresStore, _lease

WAYS = ("together", "alone")


class Counted(_lease.Renewals):
    """The store's renewals, counting their statements; ``alone`` sends each by itself."""

    alone = False
    statements = 0

    async def _send(self, due: list[Any]) -> None:
        if not Counted.alone:
            Counted.statements += 1
            await super()._send(due)
            return
        Counted.statements += len(due)
        await asyncio.gather(*(super(Counted, self)._send([one]) for one in due))


def commits(dsn: str) -> int:
    """Transactions the server's database has committed so far."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        assert row is not None
        return int(row[0])


async def measure(
    dsn: str, postmaster: int, *, handles: int, periods: int, every: float, tag: str
) -> dict[str, float]:
    """One round: ``handles`` open runs kept for ``periods`` periods; what it cost."""
    async with PostgresStore(
        dsn, lease=timedelta(seconds=every * 3), renew_every=timedelta(seconds=every)
    ) as store:
        store._renewals = Counted(store._connections)  # noqa: SLF001 -- the benchmark counts them
        opened = [await store.create(state_a(f"{tag}-{n}")) for n in range(handles)]
        await asyncio.sleep(every)
        statements, renewals = Counted.statements, store.stats.renewals
        committed, server, client = commits(dsn), server_cpu(postmaster), time.process_time()
        await asyncio.sleep(every * periods)
        figures = {
            "renewals": store.stats.renewals - renewals,
            "statements": Counted.statements - statements,
            "commits": commits(dsn) - committed - 1,  # less the first count's own
            "server_ms": (server_cpu(postmaster) - server) * 1000,
            "client_ms": (time.process_time() - client) * 1000,
        }
        for handle in opened:
            await handle.close()
    return figures


def main() -> None:
    """Run both ways in turn and print the rounds, the medians and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--handles", type=int, default=200, help="runs open on one store")
    parser.add_argument("--periods", type=int, default=10, help="renewal periods counted")
    parser.add_argument("--every", type=float, default=0.5, help="seconds a period")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of each way")
    args = parser.parse_args()
    cluster = Cluster.start()
    rounds: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    try:
        postmaster = postmaster_pid(cluster.data)
        for number in range(args.repeat):
            for way in WAYS if number % 2 == 0 else WAYS[::-1]:
                Counted.alone = way == "alone"
                found = asyncio.run(
                    measure(
                        cluster.dsn,
                        postmaster,
                        handles=args.handles,
                        periods=args.periods,
                        every=args.every,
                        tag=f"{way}-{number}",
                    )
                )
                rounds[way].append(found)
                print(
                    f"round {number + 1} {way:8} "
                    + "  ".join(f"{k} {v:.0f}" for k, v in found.items())
                )
    finally:
        cluster.stop()
    print(f"\n{args.handles} leases kept for {args.periods} periods of {args.every:g} s; medians:")
    keys = list(rounds["together"][0])
    print(f"{'':10}" + "".join(f"{k:>12}" for k in keys))
    medians = {way: {k: statistics.median(r[k] for r in rounds[way]) for k in keys} for way in WAYS}
    for way in WAYS:
        print(f"{way:10}" + "".join(f"{medians[way][k]:12.0f}" for k in keys))
    ratio = {
        k: medians["together"][k] / medians["alone"][k] if medians["alone"][k] else 0 for k in keys
    }
    print(f"{'ratio':10}" + "".join(f"{ratio[k]:12.3f}" for k in keys))


if __name__ == "__main__":
    main()
