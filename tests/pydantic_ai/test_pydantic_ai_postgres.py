"""durably.pydantic_ai on the Postgres store: a run killed mid-call does each effect once,
and Postgres workers start and finish submitted Pydantic AI runs (``worker_agent``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _pai_world import build

import durably
from _helpers.adapter_checks import Person, check_killed_on_postgres, check_worker_takeover
from _helpers.patience import stretched
from _helpers.refund_world import ANSWER, EMAIL, NOTE, TASK, Service
from durably.postgres import PostgresStore, Registry
from durably.pydantic_ai import WorkerAgent, worker_agent
from durably.sweep import RUN_ID

pytestmark = pytest.mark.postgres

TESTS = Path(__file__).parent
REFERENCE = {
    "refund 1042": 1,
    f"email {EMAIL['to']}: {EMAIL['text']}": 1,
    f"note {NOTE}": 1,
}


@pytest.mark.parametrize("occurrence", [1, 2, 3])
def test_a_postgres_run_killed_at_an_attempt_finishes_with_every_effect_once(
    tmp_path: Path, pg_dsn: str, occurrence: int
) -> None:
    """Killed by SIGKILL at its refund's, e-mail's or note's attempt marker, a run on the
    Postgres store resumed by another process does each effect once, pays for no saved reply
    twice, and ends with the scripted answer.
    """

    async def start(store: PostgresStore, service: Service, log: durably.CallLog) -> object:
        agent, _ = build(store, service, log)
        return await agent.run(TASK, run_id=RUN_ID)

    async def carry_on(
        store: PostgresStore, service: Service, log: durably.CallLog, person: Person
    ) -> object:
        agent, durable = build(store, service, log, approver=person)
        return await durable.resume(agent, RUN_ID)

    check_killed_on_postgres(tmp_path, pg_dsn, occurrence, start, carry_on, turns=[1, 2, 3, 4])


def _registry(service: Service, log: durably.CallLog) -> Registry:
    """Workers' agents: ``pai-refunds``, the Pydantic AI agent with no store of its own."""
    registry = Registry()

    def refunds(run_id: str) -> WorkerAgent:
        agent, _ = build(None, service, log, approver=Person(service))
        return worker_agent(agent)

    registry.register("pai-refunds", refunds, task=TASK)
    return registry


async def _done(store: PostgresStore) -> bool:
    """Whether the run has a state, and it is done (a queued run has none yet)."""
    try:
        return (await store.read(RUN_ID)).phase is durably.Phase.DONE
    except durably.RunNotFound:
        return False


def test_a_worker_killed_mid_call_leaves_a_pydantic_ai_run_another_worker_finishes(
    tmp_path: Path, pg_dsn: str
) -> None:
    """A submitted Pydantic AI run is started by a worker (save point 1 included); SIGKILLed
    after the refund acted and before its result was saved, the run is claimed by a second
    worker once the lease ran out, which finishes it: each effect once, no reply paid twice.
    """
    check_worker_takeover(
        tmp_path, pg_dsn, _registry, agent="pai-refunds", reference=REFERENCE, turns_after=[3, 4]
    )


def _cli(*args: str, root: Path) -> subprocess.Popen[str]:
    environment = {
        **os.environ,
        "NO_COLOR": "1",
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)]),
        "DURABLY_TEST_ROOT": str(root),
    }
    command = [sys.executable, "-m", "durably", *args, "--import", "_pai_cli_agents"]
    return subprocess.Popen(
        command,
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=environment,
    )


def test_durably_submit_and_worker_run_a_registered_pydantic_ai_agent(
    tmp_path: Path, pg_dsn: str
) -> None:
    """``durably submit --agent pai-refunds`` queues a run of the Pydantic AI agent a module
    registers as ``worker_agent(agent)``; ``durably worker --import`` that module finds it by
    name and runs it to its answer, each effect once.
    """
    service = Service(tmp_path / "service")
    log = durably.CallLog(tmp_path / "model.jsonl")
    submitted = _cli(
        "submit", "--dsn", pg_dsn, "--agent", "pai-refunds", "--run", RUN_ID, root=tmp_path
    )
    out, _ = submitted.communicate(timeout=stretched(60))
    assert submitted.returncode == 0, out
    assert out.strip() == RUN_ID

    worker = _cli("worker", "--dsn", pg_dsn, root=tmp_path)
    try:

        async def answered() -> durably.RunState:
            async with PostgresStore(pg_dsn) as store:
                deadline = time.monotonic() + stretched(60)
                while not await _done(store):
                    assert time.monotonic() < deadline, "the worker did not finish the run"
                    assert worker.poll() is None
                    await asyncio.sleep(0.1)
                return await store.read(RUN_ID)

        state = asyncio.run(answered())
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=stretched(60))
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()

    assert worker.returncode == 0, out
    assert "agents: pai-refunds" in out
    assert "1 done" in out
    assert state.answer == ANSWER
    assert service.effects() == REFERENCE
    assert log.turns(RUN_ID) == [1, 2, 3, 4]
