"""Checks both agent adapters' tests make the same way: the sweep's table, the Postgres kill.

tests/pydantic_ai and tests/openai_agents differ only in how their agent is started
and carried on; these helpers take that as callables and check the rest once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import durably
from _helpers.patience import stretched
from _helpers.refund_world import ANSWER, EMAIL, NOTE, TASK, Service
from durably import faults
from durably.engine import SavePoint
from durably.postgres import PostgresStore, Registry, WorkReport, submit, work
from durably.sweep import RUN_ID, SweepReport, run_in_child

if TYPE_CHECKING:
    from psycopg import AsyncConnection

LEASE = timedelta(seconds=1)
"""The killed process's lease: the next process may take the run once it has run out."""


def check_sweep(report: SweepReport, reference: Path) -> None:
    """The sweep's rows are safe where protected, its baselines fail, its table is ``reference``.

    The table is printed (shown with -s: the table the docs quote) and rewritten
    under DURABLY_REGENERATE.
    """
    text = report.text()
    print(text)
    if os.environ.get("DURABLY_REGENERATE"):
        reference.write_text(text)

    rows = {(r.config, r.depth): r for r in report.rows()}
    for row in rows.values():
        assert row.scenarios > 0, row
        assert row.errors == 0, row
        if row.protected:
            assert (row.duplicates, row.lost, row.paid_twice, row.failed_checks) == (0, 0, 0, 0)
            assert row.finished == row.scenarios
    assert rows[("naive retry", 1)].duplicates > 0
    assert rows[("at-most-once", 1)].lost > 0
    # Only the note (no key, no lookup) reaches a person, unless lookups are off.
    assert rows[("keys honoured", 1)].questions < rows[("lookups off", 1)].questions
    assert text == reference.read_text()


class Person:
    """Someone who checks the service when asked about an in-doubt call."""

    def __init__(self, service: Service) -> None:
        self.service = service

    async def approve(self, request: durably.ApprovalRequest) -> durably.Yes:
        """Yes to every call."""
        return durably.Yes()

    async def resolve(self, request: durably.ResolveRequest) -> durably.Rerun | durably.Done:
        """Done when the note is there, else rerun."""
        noted = any(e["text"] == NOTE for e in self.service.lines("notes"))
        return durably.Done("noted (checked)") if noted else durably.Rerun()


Start = Callable[[PostgresStore, Service, durably.CallLog], Awaitable[object]]
"""Start the run ``RUN_ID`` on the store: the adapter's agent built anew."""

CarryOn = Callable[[PostgresStore, Service, durably.CallLog, Person], Awaitable[object]]
"""Resume the run ``RUN_ID`` on the store, with ``Person`` as the approver."""


def check_killed_on_postgres(
    root: Path, dsn: str, occurrence: int, start: Start, carry_on: CarryOn, *, turns: list[int]
) -> None:
    """Kill ``start`` by SIGKILL at its ``occurrence``-th attempt marker, ``carry_on`` in this
    process: each effect once, the scripted answer, no saved reply paid for twice, the
    model asked for exactly ``turns``.
    """
    service = Service(root / "service")
    service.prepare()
    log = durably.CallLog(root / "model.jsonl")

    def first() -> None:
        async def main() -> None:
            async with PostgresStore(dsn, lease=LEASE) as store:
                await start(store, service, log)

        plan = faults.CrashPlan(label=SavePoint.ATTEMPT.crash_point, occurrence=occurrence)
        with faults.installed(plan):
            asyncio.run(main())

    status = run_in_child(first)
    assert os.WIFSIGNALED(status)
    assert os.WTERMSIG(status) == signal.SIGKILL
    asked = log.turns(RUN_ID)

    async def resume() -> durably.RunState:
        async with PostgresStore(dsn, lease=LEASE) as store:
            deadline = time.monotonic() + stretched(120)  # generous: the dead lease runs out in 1 s
            while True:
                try:
                    await carry_on(store, service, log, Person(service))
                    break
                except durably.Locked:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
            return await store.read(RUN_ID)

    state = asyncio.run(resume())

    assert state.answer == ANSWER
    assert service.effects() == {
        "refund 1042": 1,
        f"email {EMAIL['to']}: {EMAIL['text']}": 1,
        f"note {NOTE}": 1,
    }
    assert log.turns(RUN_ID)[: len(asked)] == asked
    assert sorted(set(log.turns(RUN_ID))) == turns
    assert log.paid_twice(RUN_ID) == 0


async def work_until_done(store: PostgresStore, registry: Registry) -> WorkReport:
    """Run a worker until it has finished the run, then stop it and return its report.

    Finished means the run is saved done and its lease was freed: the worker's task
    for it has ended (and counted it). Stopped as soon as the state read done, the
    worker could cancel that task between its last save and its return, and count
    the run as handed back.
    """
    stop = asyncio.Event()
    worker = asyncio.create_task(work(store, registry=registry, stop=stop, poll=0.05))
    deadline = time.monotonic() + stretched(120)  # a dead lease runs out in 1 s
    while not await _finished(store):
        assert time.monotonic() < deadline, "the worker did not finish the run in time"
        assert not worker.done(), worker
        await asyncio.sleep(0.05)
    stop.set()
    return await worker


async def _finished(store: PostgresStore) -> bool:
    """Whether the run is saved done and nobody holds its lease."""
    try:
        if (await store.read(RUN_ID)).phase is not durably.Phase.DONE:
            return False
    except durably.RunNotFound:  # queued: no state yet
        return False

    async def free(conn: AsyncConnection[tuple[Any, ...]]) -> bool:
        cursor = await conn.execute(
            "SELECT expires_at IS NULL FROM durably_runs WHERE run_id = %s", (RUN_ID,)
        )
        row = await cursor.fetchone()
        return row is not None and bool(row[0])

    return await store.execute(free, what="reading the run's lease", writes=False)


def check_worker_takeover(
    tmp_path: Path,
    dsn: str,
    registry: Callable[[Service, durably.CallLog], Registry],
    *,
    agent: str,
    reference: dict[str, int],
    turns_after: list[int],
) -> None:
    """A queued run's first worker is SIGKILLed after the refund acted, before its result
    was saved; a second worker claims it once the lease ran out and finishes it.

    Checks each effect once (``reference``), the run resumed once and done, the model
    asked only for ``turns_after`` past what the first worker had asked, and no reply
    paid twice.
    """
    service = Service(tmp_path / "service")
    service.prepare()
    log = durably.CallLog(tmp_path / "model.jsonl")

    async def queue() -> None:
        async with PostgresStore(dsn, lease=LEASE) as store:
            await submit(store, agent_name=agent, task=TASK, run_id=RUN_ID)

    asyncio.run(queue())

    def first() -> None:
        async def main() -> None:
            async with PostgresStore(dsn, lease=LEASE) as store:
                await work_until_done(store, registry(service, log))

        with faults.installed(faults.CrashPlan(label="loop.tool_returned:refund")):
            asyncio.run(main())

    status = run_in_child(first)
    assert os.WIFSIGNALED(status), status
    assert os.WTERMSIG(status) == signal.SIGKILL, status
    assert service.effects() == {"refund 1042": 1}
    asked = log.turns(RUN_ID)

    async def second() -> tuple[WorkReport, durably.RunState]:
        async with PostgresStore(dsn, lease=LEASE) as store:
            report = await work_until_done(store, registry(service, log))
            return report, await store.read(RUN_ID)

    report, state = asyncio.run(second())

    assert (report.claimed, report.started, report.done) == (1, 0, 1)
    assert state.answer == ANSWER
    assert state.resumes == 1
    assert service.effects() == reference
    assert log.turns(RUN_ID) == [*asked, *turns_after]
    assert log.paid_twice(RUN_ID) == 0
