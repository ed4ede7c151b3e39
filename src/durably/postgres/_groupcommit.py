"""Group commit for a Postgres store's saves: a few statements in flight, the rest together.

A save goes at once while fewer than :data:`SAVES_IN_FLIGHT` save statements are in
flight; otherwise it waits, and the saves waiting when a statement ends go together
in one (:data:`~durably.postgres._sql.SAVE_MANY`). A run has one save in flight at a
time, so its saves land in the order they were made.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from . import _sql
from ._connection import Connections, is_transient

__all__ = ["SAVES_IN_FLIGHT", "GroupCommit"]

log = logging.getLogger("durably.store")

SAVES_IN_FLIGHT = 2
"""Save statements one store has in flight at once; saves arriving while that many are
wait, and go together in one statement when one ends (group commit). Two keep one
statement on the wire while the other commits. The cap was chosen among 2, 4 and 8 by
``benchmarks/postgres.py``'s phases (the rates are in docs/design.md); bigger groups
cost less client and server CPU per save."""


@dataclass(slots=True)
class _Pending:
    """A save waiting for a group statement."""

    params: dict[str, Any]
    deadline: float
    outcome: asyncio.Future[tuple[bool, bool] | None]
    """(landed, cancel asked): see :meth:`GroupCommit.save`; None: send it again alone."""


def _handed_back(pending: _Pending) -> bool:
    """Whether a failed group gave this save back to its caller to send alone."""
    outcome = pending.outcome
    return outcome.done() and not outcome.cancelled() and outcome.result() is None


class GroupCommit:
    """Sends one store's saves, grouping those that arrive while statements are in flight.

    Args:
        connections: the store's connections, which send the statements.
    """

    def __init__(self, connections: Connections) -> None:
        self._connections = connections
        self._saving = 0
        """Save statements in flight."""
        self._waiting: list[_Pending] = []
        """Saves waiting for the next group statement."""
        self._sending: set[str] = set()
        """Runs with a save statement in flight."""
        self._groups: set[asyncio.Task[None]] = set()

    async def save(self, params: dict[str, Any], deadline: float) -> tuple[bool, bool]:
        """Send one run's save (see :meth:`PostgresRun.save`): (landed, cancel asked).

        Landed False: fenced, nothing written. Cancel asked: the row holds a
        ``durably cancel`` request for its owner.

        Group commit: a save goes at once while fewer than :data:`SAVES_IN_FLIGHT`
        save statements are in flight; otherwise it waits, and the saves waiting
        when a statement ends go together in one (:meth:`_send_group`). A group
        statement that fails as a whole (a broken connection, a deadlock) is not
        retried as a group: each of its saves is sent again alone, with the
        retries, deadline and errors of a lone save. That is safe because every
        row is conditional on its own token and lease: sending a save that did
        land again writes the same state.

        Args:
            params: the run's ``run_id``, ``token``, ``seq``, ``phase``, and either its
                sealed ``state`` (a snapshot) or its ``change`` record (the other None).
            deadline: ``time.monotonic()`` after which the lease may have run out.
        """
        run_id = params["run_id"]
        if self._saving >= self._in_flight_cap() or self._waiting or run_id in self._sending:
            pending = _Pending(params, deadline, asyncio.get_running_loop().create_future())
            self._waiting.append(pending)
            try:
                landed = await pending.outcome
            except asyncio.CancelledError:
                if _handed_back(pending):
                    # Cancelled as its group failed: the run's turn to send ends here.
                    self._sending.discard(run_id)
                    self._send_waiting()
                raise
            if landed is not None:
                return landed
            # The group failed: this run is still marked as sending (so a later save of
            # it waits), and this save goes again alone before anything else of the run.
        self._saving += 1
        self._sending.add(run_id)
        try:
            runs = await self._connections.run(
                _sql.saving([params]), what="saving", run_id=run_id, until=deadline
            )
            return run_id in runs, runs.get(run_id, False)
        finally:
            self._saving -= 1
            self._sending.discard(run_id)
            if self._waiting:
                self._send_waiting()

    def _send_waiting(self) -> None:
        """Send the waiting saves, as one statement per free place in flight.

        A run has one save in flight at a time: its next one waits for the statement
        to end, so two saves of one run land in the order they were made (and a
        statement never holds two rows of one run, of which one would land arbitrarily).
        """
        while self._waiting and self._saving < self._in_flight_cap():
            group: list[_Pending] = []
            later: list[_Pending] = []
            runs: set[str] = set()
            for pending in self._waiting:
                if pending.outcome.done():  # its caller was cancelled before it was sent
                    continue
                run_id = pending.params["run_id"]
                if run_id in runs or run_id in self._sending:
                    later.append(pending)
                else:
                    group.append(pending)
                    runs.add(run_id)
            self._waiting = later
            if not group:
                return  # what still waits goes when its run's statement ends
            # One order of rows in every group: two groups that share runs (a process
            # fenced off and the new owner) lock their rows in the same order.
            group.sort(key=lambda p: str(p.params["run_id"]))
            self._saving += 1
            self._sending |= runs
            task = asyncio.create_task(self._send_group(group), name="durably-save-group")
            self._groups.add(task)
            task.add_done_callback(self._groups.discard)

    async def _send_group(self, group: list[_Pending]) -> None:
        """One try of one statement for the group; each waiting save learns its own row's fate."""
        landed: _sql.Landed | None = None
        try:
            landed = await self._connections.attempt(
                _sql.saving([p.params for p in group]), min(p.deadline for p in group)
            )
            if len(group) > 1:
                self._connections.stats.grouped += len(group)
        except Exception as exc:  # noqa: BLE001 - any failure of a group is handed to each of its saves, none lost
            log.log(
                logging.INFO if is_transient(exc) else logging.WARNING,
                "saving %d runs in one statement failed (%s: %s); each is sent again alone",
                len(group),
                type(exc).__name__,
                exc,
            )
        finally:
            for pending in group:
                if not pending.outcome.done():
                    run_id = pending.params["run_id"]
                    pending.outcome.set_result(
                        None if landed is None else (run_id in landed, landed.get(run_id, False))
                    )
                if not _handed_back(pending):
                    self._sending.discard(pending.params["run_id"])
                # else the run stays marked until its caller has sent the save alone
            self._saving -= 1
            if self._waiting:
                self._send_waiting()

    def _in_flight_cap(self) -> int:
        """How many save statements may be in flight at once.

        :data:`SAVES_IN_FLIGHT`, fewer with a small pool: two connections stay free for
        renewals and reads.
        """
        return max(1, min(SAVES_IN_FLIGHT, self._connections.max_size - 2))
