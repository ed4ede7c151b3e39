"""On Postgres, a person's answer saved by ``durably answer`` makes the run claimable again."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from starlette.testclient import TestClient

from _helpers.patience import stretched
from durably import Agent, Call, Effect, Reply, ScriptedModel, ToolContext, tool
from durably.cli import main
from durably.console.server import create_app
from durably.decisions import AskLater
from durably.errors import RunNotFound
from durably.postgres import PostgresStore, Registry, submit, work
from durably.state import Phase
from durably.storechoice import StoreChoice

pytestmark = pytest.mark.postgres

EXAMPLES = Path(__file__).parent.parent.parent / "examples"


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """One ``durably`` command in this process: its exit code, stdout and stderr."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exited.value.code or 0), out, err


async def work_until(dsn: str, registry: Registry, run_id: str, phase: Phase) -> None:
    """Run a worker until the run reaches ``phase``, then stop it."""
    async with PostgresStore(dsn) as store:
        stop = asyncio.Event()
        worker = asyncio.create_task(work(store, registry=registry, stop=stop, poll=0.05))
        deadline = time.monotonic() + stretched(30)
        while True:
            try:
                if (await store.read(run_id)).phase is phase:
                    break
            except RunNotFound:
                pass  # still queued
            assert time.monotonic() < deadline, f"the run did not reach {phase}"
            assert not worker.done(), worker
            await asyncio.sleep(0.05)
        stop.set()
        await worker


def claimable(dsn: str, run_id: str) -> bool:
    """Whether a worker's claim query would take the run (phase model/tools, not parked)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT phase IN ('queued', 'model', 'tools') AND parked IS NULL "
            "FROM durably_runs WHERE run_id = %s",
            (run_id,),
        ).fetchone()
    assert row is not None
    return bool(row[0])


def test_an_answer_on_postgres_hands_the_run_back_to_the_workers(
    pg_dsn: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``pending --dsn`` lists the worker's paused run; ``answer --dsn`` has a worker finish it."""
    monkeypatch.chdir(tmp_path)  # the example's payment ledger lands here
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.delenv("DURABLY_DSN", raising=False)
    import refund_agent

    registry = Registry()
    make: Callable[[str], object] = lambda run_id: refund_agent.agent()  # noqa: E731
    registry.register("refund", make)  # type: ignore[arg-type]

    async def queue() -> str:
        async with PostgresStore(pg_dsn) as store:
            # A run queued for an agent no worker here runs: listed, but no state to read yet.
            await submit(store, agent_name="elsewhere", task="not started")
            return await submit(store, agent_name="refund", task="refund order 1042")

    run_id = asyncio.run(queue())
    asyncio.run(work_until(pg_dsn, registry, run_id, Phase.PAUSED))
    assert not claimable(pg_dsn, run_id)

    code, out, err = cli(capsys, "pending", "--dsn", pg_dsn, "--json")
    assert code == 0, err
    assert [(q["run"], q["call"], q["kind"]) for q in json.loads(out)] == [
        (run_id, "call-refund-1042", "approval")
    ]
    code, out, err = cli(capsys, "answer", run_id, "call-refund-1042", "yes", "--dsn", pg_dsn)
    assert code == 0, err
    assert claimable(pg_dsn, run_id)
    code, _, err = cli(capsys, "answer", run_id, "call-refund-1042", "yes", "--dsn", pg_dsn)
    assert code == 1
    assert "already answered" in err

    asyncio.run(work_until(pg_dsn, registry, run_id, Phase.DONE))

    ledger = (tmp_path / "refunds.jsonl").read_text().splitlines()
    assert [json.loads(line)["order"] for line in ledger] == ["1042"]
    code, out, _ = cli(capsys, "pending", "--dsn", pg_dsn, "--json")
    assert (code, json.loads(out)) == (0, [])


def test_the_console_answers_a_run_in_postgres(pg_dsn: str) -> None:
    """The console lists a Postgres run's question and its answer hands the run to workers."""

    @tool(effect=Effect.KEYED, key_ttl=timedelta(hours=23), needs_approval=True)
    async def refund(ctx: ToolContext, order_id: str) -> str:
        """Refund an order."""
        return f"refunded (key {ctx.idempotency_key})"  # the service's echo of the key sent

    async def start() -> None:
        async with PostgresStore(pg_dsn) as store:
            model = ScriptedModel(
                [Reply(calls=[Call(id="c1", name="refund", arguments='{"order_id": "7"}')])]
            )
            agent = Agent(model=model, tools=[refund], store=store, approver=AskLater())
            assert (await agent.run("refund 7", run_id="pg-run")).status == "paused"

    asyncio.run(start())
    app = create_app(StoreChoice(dsn=pg_dsn), token="t")  # noqa: S106 (a test token)
    with TestClient(app, base_url="http://127.0.0.1", follow_redirects=False) as client:
        assert 'data-call="c1"' in client.get("/t/t/questions").text
        stamp = client.get("/t/t/runs/pg-run", params={"stamp": "1"}).text
        response = client.post("/t/t/runs/pg-run/answer", data={"call": "c1", "answer": "yes"})
        assert response.status_code == 303
        assert client.get("/t/t/runs/pg-run", params={"stamp": "1"}).text != stamp
    assert claimable(pg_dsn, "pg-run")
