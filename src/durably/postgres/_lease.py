"""A run's lease as a handle holds it, keeps it and loses it; the lease the current task drives."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import os
import secrets
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..errors import LeaseLost, SaveFailed, StoreUnavailable
from . import _sql
from ._sql import cursor_of, fetchone

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    from ._connection import Connections

__all__ = [
    "CURRENT_LEASE",
    "Lease",
    "LeaseKeeper",
    "Renewals",
    "current_lease",
    "default_owner",
    "lost_how",
]

log = logging.getLogger("durably.store")


@dataclass(frozen=True, kw_only=True)
class Lease:
    """A run's lease as one handle holds it: whose, and under which fencing token."""

    run_id: str
    token: int
    owner: str


CURRENT_LEASE: contextvars.ContextVar[Lease | None] = contextvars.ContextVar(
    "durably_current_lease", default=None
)


def current_lease() -> Lease | None:
    """The lease of the Postgres run the current task drives, or None.

    A tool whose service can check a fencing token (reject requests carrying a
    token lower than one it has seen for the run) sends ``current_lease().token``:
    that closes the one window leases cannot, a process that stalls between its
    attempt save and the request while another process takes the run over.
    """
    return CURRENT_LEASE.get()


def default_owner() -> str:
    """This process, as a lease names its owner: host, PID and a random tag."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def lost_how(row: tuple[Any, ...] | None, token: int, why: str, me: str) -> str:
    """What became of a lost lease, for ``LeaseLost``: it lapsed, or who took the run since.

    Args:
        row: the run's ``owner``, ``token`` and whether its lease is live now
            (:data:`~durably.postgres._sql.HOLDER`), or None if the row is gone.
        token: the fencing token of the lost lease.
        why: how the handle found out.
        me: this store's owner name.
    """
    if row is None:
        return f"is gone with its row (deleted; {why}); nothing was written; stop here"
    owner, now_token, live = row[0], int(row[1]), bool(row[2])
    if now_token == token:
        if live:  # this process gave up by its own clock, before the database's expiry
            cause = f"lapsed ({why}; the database has not seen it expire yet)"
        else:
            cause = "lapsed (it expired by the database clock before a renewal reached it)"
        return (
            f"{cause} and no other worker has taken the run since; nothing was written; "
            "stop here, a worker claims the run again"
        )
    if owner == me:
        return (
            f"lapsed and this worker claimed the run again (token {now_token}); nothing was "
            "written through the old lease; stop here, the new claim carries on"
        )
    return (
        f"lapsed and was taken over by {owner} (token {now_token}); nothing was written; "
        "stop here, the new owner carries on"
    )


class Renewals:
    """The renewals of one store's leases: those that come due together go in one statement.

    Every keeper of a store renews on the instants of one grid, half a period apart
    (:meth:`LeaseKeeper.first_renewal`), so a worker's hundred leases come due in at
    most two turns of the event loop a period and cost one ``UPDATE`` and one commit each
    (:data:`~durably.postgres._sql.RENEW`), not a hundred. Each row is renewed on its
    own condition, as a lone renewal is.

    Args:
        connections: the store's pool and retrying sender.
    """

    def __init__(self, connections: Connections) -> None:
        self.connections = connections
        self._due: list[tuple[Lease, float, asyncio.Future[bool]]] = []
        self._sending: set[asyncio.Task[None]] = set()

    async def renew(self, lease: Lease, until: float) -> bool:
        """Renew ``lease`` with the others due now; whether the database renewed it.

        Args:
            lease: the lease to renew.
            until: its keeper's deadline: a broken connection is retried until the
                earliest deadline of the leases sent together.

        Raises:
            SaveFailed, StoreUnavailable: the database could not be reached in time.
        """
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[bool] = loop.create_future()
        if not self._due:
            # After every keeper woken in this turn of the loop has joined.
            loop.call_soon(self._send_due)
        self._due.append((lease, until, outcome))
        return await outcome

    def _send_due(self) -> None:
        due = [entry for entry in self._due if not entry[2].done()]  # not cancelled meanwhile
        self._due = []
        if due:
            task = asyncio.create_task(self._send(due), name="durably-renew-leases")
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, due: list[tuple[Lease, float, asyncio.Future[bool]]]) -> None:
        # One row order for every statement: two that share rows lock them alike.
        due.sort(key=lambda entry: entry[0].run_id)
        params = {
            "run_ids": [lease.run_id for lease, _, _ in due],
            "tokens": [lease.token for lease, _, _ in due],
            "lease": self.connections.lease,
        }

        async def update(conn: AsyncConnection[tuple[Any, ...]]) -> set[str]:
            cursor = await cursor_of(conn).execute(_sql.RENEW, params)
            return {str(row[0]) for row in await cursor.fetchall()}

        lone = due[0][0].run_id if len(due) == 1 else "-"
        try:
            renewed = await self.connections.run(
                update, what="renewing the lease", run_id=lone, until=min(u for _, u, _ in due)
            )
        except asyncio.CancelledError:
            for _, _, outcome in due:
                outcome.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - handed to each keeper, which judges it
            for _, _, outcome in due:
                if not outcome.done():
                    outcome.set_exception(exc)
            return
        for lease, _, outcome in due:
            if not outcome.done():
                outcome.set_result(lease.run_id in renewed)


class LeaseKeeper:
    """One handle's hold on its run's lease: renewed every period until it stops, or is lost.

    The deadline is this process's own bound (``time.monotonic()``), the send time of
    the last statement that set the lease plus the lease: past it the lease has surely
    run out, whatever the database says. ``lost`` says why the lease is known to be
    gone; once set, the handle's next save raises :meth:`lost_error` before anything
    is sent.

    Args:
        connections: the store's pool and retrying sender (its ``stats`` are counted).
        lease: the handle's lease (it lasts ``connections.lease``).
        every: how often it is renewed.
        deadline: when the lease taken (or last renewed) surely runs out.
        renewals: the store's renewals, which this keeper's join.
    """

    def __init__(
        self,
        connections: Connections,
        lease: Lease,
        *,
        every: timedelta,
        deadline: float,
        renewals: Renewals,
    ) -> None:
        self.connections = connections
        self.renewals = renewals
        self.lease = lease
        self.every = every
        self.deadline = deadline
        self.lost: str | None = None
        self.renewal = asyncio.create_task(
            self._renew_forever(), name=f"durably-renew-{lease.run_id}"
        )

    def check(self) -> None:
        """Mark the lease lost if its deadline has passed with no renewal."""
        if self.lost is None and time.monotonic() >= self.deadline:
            self.mark_lost("no renewal reached the database before the lease ran out")

    def mark_lost(self, why: str) -> None:
        """Take the lease as lost (the first reason is kept) and stop renewing it."""
        if self.lost is None:
            self.lost = why
            self.connections.stats.lost += 1
            log.warning(
                "run %s: lease (token %d) lost: %s", self.lease.run_id, self.lease.token, why
            )
            if not self.renewal.done() and self.renewal is not asyncio.current_task():
                self.renewal.cancel()

    async def lost_error(self) -> LeaseLost:
        """``LeaseLost``, saying whether the lease only lapsed or who took the run since."""
        run_id, token = self.lease.run_id, self.lease.token
        params = {"run_id": run_id}

        async def select(conn: AsyncConnection[tuple[Any, ...]]) -> tuple[Any, ...] | None:
            return await fetchone(conn, _sql.HOLDER, params)

        why = self.lost or "the lease was lost"
        try:
            row = await self.connections.run(
                select,
                what="reading who holds the lease",
                run_id=run_id,
                until=time.monotonic() + 2.0,
                writes=False,
            )
        except Exception as exc:  # noqa: BLE001 - only to word the error: the lease is lost either way
            how = (
                f"lapsed ({why}); who holds it now could not be read ({exc}); nothing was "
                "written; stop here"
            )
            return LeaseLost(run_id=run_id, token=token, how=how)
        return LeaseLost(
            run_id=run_id, token=token, how=lost_how(row, token, why, self.lease.owner)
        )

    async def stop(self, *, release: bool) -> None:
        """Stop renewing; with ``release``, free the lease if it is still this handle's."""
        self.renewal.cancel()
        # asyncio.wait, not await: the renewal's CancelledError is its own, while a
        # cancellation of this stop() must still propagate.
        await asyncio.wait([self.renewal])
        if self.lost is not None or not release:
            return
        run_id = self.lease.run_id
        params = {"run_id": run_id, "token": self.lease.token}

        async def update(conn: AsyncConnection[tuple[Any, ...]]) -> None:
            await _sql.cursor_of(conn).execute(_sql.RELEASE, params)

        try:
            await self.connections.run(
                update,
                what="releasing the lease",
                run_id=run_id,
                until=min(self.deadline, time.monotonic() + 2.0),
            )
        except SaveFailed as exc:
            # Nothing depends on it: the lease runs out on its own.
            log.warning("run %s: could not free its lease (%s); it expires by itself", run_id, exc)

    def first_renewal(self, now: float) -> float:
        """When the first renewal is due (``time.monotonic()``): an instant of the store's grid.

        The grid's instants are half a period apart, the same for every keeper of a
        store, so the renewals due go together (:class:`Renewals`): a worker's leases
        fall in two cohorts at most, two statements a period. The first renewal comes
        between half a period and a period after the lease was taken, never later than
        a period (as before the grid) and never sooner than half of one, so a lease just
        taken is not renewed at once; the next ones, :meth:`next_renewal`.
        """
        half = self.every.total_seconds() / 2
        return math.ceil((now + half) / half) * half

    def next_renewal(self, due: float, sent: float) -> float:
        """When the renewal after one due at ``due`` and sent at ``sent`` is due.

        A period on when it was sent on time; after a late wake-up (a loaded machine)
        the grid's first instant at least half a period on, so renewals are never
        more than a period apart however late one was.
        """
        return max(due + self.every.total_seconds(), self.first_renewal(sent))

    async def _renew_forever(self) -> None:
        run_id = self.lease.run_id
        seconds = self.connections.lease.total_seconds()
        due = self.first_renewal(time.monotonic())
        while self.lost is None:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            sent = time.monotonic()
            due = self.next_renewal(due, sent)
            if sent >= self.deadline:
                self.mark_lost("the lease ran out before it could be renewed")
                return
            try:
                # One renewal a period, retried through a broken connection or a server
                # restart until the lease runs out: an outage shorter than what is left
                # of the lease costs nothing. A renewal that lands after the lease ran
                # out changes nothing (it is conditional).
                renewed = await self.renewals.renew(self.lease, self.deadline)
            except (SaveFailed, StoreUnavailable) as exc:  # retries off, or all but out
                log.info("run %s: renewal failed (%s); trying again", run_id, exc)
                continue
            except Exception as exc:  # noqa: BLE001 - not a connection problem: the lease cannot be trusted
                self.mark_lost(f"renewing failed: {type(exc).__name__}: {exc}")
                return
            if not renewed:
                self.mark_lost("the lease was taken over or expired")
                return
            self.deadline = sent + seconds
            self.connections.stats.renewals += 1
