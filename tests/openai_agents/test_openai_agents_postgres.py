"""durably.openai_agents on the Postgres store: a run killed mid-call does each effect once."""

from __future__ import annotations

from pathlib import Path

import pytest
from _oai_world import build

import durably
from _helpers.adapter_checks import Person, check_killed_on_postgres
from _helpers.refund_world import TASK, Service
from durably.postgres import PostgresStore
from durably.sweep import RUN_ID

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize("occurrence", [1, 2, 3])
def test_a_postgres_run_killed_at_an_attempt_finishes_with_every_effect_once(
    tmp_path: Path, pg_dsn: str, occurrence: int
) -> None:
    """Killed by SIGKILL at its refund's, e-mail's or note's attempt marker, a run on the
    Postgres store resumed by another process does each effect once, pays for no saved reply
    twice, and ends with the scripted answer.
    """

    async def start(store: PostgresStore, service: Service, log: durably.CallLog) -> object:
        agent, runner = build(store, service, log)
        return await runner.run(agent, TASK, run_id=RUN_ID)

    async def carry_on(
        store: PostgresStore, service: Service, log: durably.CallLog, person: Person
    ) -> object:
        agent, runner = build(store, service, log, approver=person)
        return await runner.resume(agent, RUN_ID)

    check_killed_on_postgres(tmp_path, pg_dsn, occurrence, start, carry_on, turns=[1, 2, 3, 4, 5])
