"""durably.openai_agents on the Postgres store: a run killed mid-call does each effect once."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from datetime import timedelta
from pathlib import Path

import pytest
from _oai_world import ANSWER, EMAIL, NOTE, TASK, Service, build

import durably
from durably import faults
from durably.engine import SavePoint
from durably.postgres import PostgresStore
from durably.sweep import RUN_ID, run_in_child

pytestmark = pytest.mark.postgres

LEASE = timedelta(seconds=1)
"""The killed process's lease: the next process may take the run once it has run out."""


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


@pytest.mark.parametrize("occurrence", [1, 2, 3])
def test_a_postgres_run_killed_at_an_attempt_finishes_with_every_effect_once(
    tmp_path: Path, pg_dsn: str, occurrence: int
) -> None:
    """Killed by SIGKILL at its refund's, e-mail's or note's attempt marker, a run on the
    Postgres store resumed by another process does each effect once, pays for no saved reply
    twice, and ends with the scripted answer.
    """
    service = Service(tmp_path / "service")
    service.prepare()
    log = durably.CallLog(tmp_path / "model.jsonl")

    def first() -> None:
        async def main() -> None:
            async with PostgresStore(pg_dsn, lease=LEASE) as store:
                agent, runner = build(store, service, log)
                await runner.run(agent, TASK, run_id=RUN_ID)

        plan = faults.CrashPlan(label=SavePoint.ATTEMPT.crash_point, occurrence=occurrence)
        with faults.installed(plan):
            asyncio.run(main())

    status = run_in_child(first)
    assert os.WIFSIGNALED(status)
    assert os.WTERMSIG(status) == signal.SIGKILL
    asked = log.turns(RUN_ID)

    async def resume() -> durably.RunState:
        async with PostgresStore(pg_dsn, lease=LEASE) as store:
            agent, runner = build(store, service, log, approver=Person(service))
            deadline = time.monotonic() + 120  # generous: the dead lease runs out in 1 s
            while True:
                try:
                    await runner.resume(agent, RUN_ID)
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
    assert sorted(set(log.turns(RUN_ID))) == [1, 2, 3, 4, 5]
    assert log.paid_twice(RUN_ID) == 0
