"""Postgres from the command line, as a role that may only read (issue 31, finding 14)."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from datetime import timedelta

import psycopg
import pytest
from _pg_cluster import Cluster

from _helpers.patience import stretched
from durably import Agent, Call, Effect, Reply, ScriptedModel, ToolContext, tool
from durably.cli import EXIT
from durably.decisions import AskLater
from durably.postgres import PostgresStore

pytestmark = pytest.mark.postgres


def paused_run(dsn: str) -> None:
    """A run ``pg-run`` paused on the approval of call ``c1``."""

    @tool(effect=Effect.KEYED, key_ttl=timedelta(hours=24), needs_approval=True)
    async def refund(ctx: ToolContext, order_id: str) -> str:
        """Refund an order."""
        return f"refunded under key {ctx.idempotency_key}"

    async def start() -> None:
        async with PostgresStore(dsn) as store:
            model = ScriptedModel(
                [Reply(calls=[Call(id="c1", name="refund", arguments='{"order_id": "7"}')])]
            )
            agent = Agent(model=model, tools=[refund], store=store, approver=AskLater())
            assert (await agent.run("refund 7", run_id="pg-run")).status == "paused"

    asyncio.run(start())


def read_only_role(cluster: Cluster, dsn: str) -> str:
    """A login role that may read the store's tables and change nothing; its DSN."""
    role = f"ro_{secrets.token_hex(4)}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        schema = conn.execute("SELECT current_schema()").fetchone()
        assert schema is not None
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT USAGE ON SCHEMA {schema[0]} TO {role}")
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema[0]} TO {role}")
    return dsn.replace("user=postgres", f"user={role}")


def durably(*args: str) -> subprocess.CompletedProcess[str]:
    """The durably command in a process of its own."""
    environment = {k: v for k, v in os.environ.items() if k != "DURABLY_DSN"}
    return subprocess.run(
        [sys.executable, "-m", "durably", *args],
        capture_output=True,
        text=True,
        env={**environment, "COLUMNS": "400"},
        timeout=stretched(120),
        check=False,
    )


def test_answer_as_a_read_only_role_is_a_one_line_storage_error(
    pg_cluster: Cluster, pg_dsn: str
) -> None:
    """``durably answer`` with a role that may not write says so in one line naming the
    privilege to grant (exit 1), not a psycopg traceback; the question stays open.
    """
    paused_run(pg_dsn)
    reader = read_only_role(pg_cluster, pg_dsn)
    listed = durably("pending", "--dsn", reader, "--json")
    assert listed.returncode == EXIT["done"], listed.stderr
    assert '"call": "c1"' in listed.stdout

    answered = durably("answer", "pg-run", "c1", "yes", "--dsn", reader)
    assert answered.returncode == EXIT["failed"], answered.stdout + answered.stderr
    assert "Traceback" not in answered.stderr, answered.stderr
    lines = answered.stderr.strip().splitlines()
    assert len(lines) == 1, answered.stderr
    assert "permission denied" in lines[0]
    assert "grant" in lines[0].lower()
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(
            "SELECT phase FROM durably_runs WHERE run_id = 'pg-run'"
        ).fetchone() == ("paused",)
