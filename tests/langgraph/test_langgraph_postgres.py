"""PostgresThreadSaver with real processes on a throwaway PostgreSQL cluster.

One writer per thread across processes: the second claimant gets ThreadLocked before
any node runs; a stale owner (stopped past its lease while another took the thread
over) has its next write refused by the database's fence; a keyed tool under
DurableTools on the Postgres saver charges once across a SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _lg_agent import build, question

from _helpers.patience import stretched
from durably.errors import LeaseLost
from durably.langgraph import PostgresThreadSaver, ThreadLocked

HERE = Path(__file__).parent
THREAD: Any = {"configurable": {"thread_id": "t"}}


class PgThread:
    """Thread ``t`` of a Postgres saver, set up to charge next; processes run on it."""

    def __init__(self, tmp_path: Path, dsn: str) -> None:
        self.tmp = tmp_path
        self.dsn = dsn
        self.charges = tmp_path / "charges"
        self.charges.touch()
        assert self.finish(self.start("setup")) == {"how": "set up"}

    def start(self, mode: str, gate: str = "-", lease: float = 15) -> subprocess.Popen[str]:
        """Start a process in ``mode``; with a gate, its charge waits for :meth:`open`."""
        gate_path = "-" if gate == "-" else str(self.tmp / gate)
        argv = [f"pg:{self.dsn}", "t", mode, str(self.charges), gate_path]
        env = {**os.environ, "LG_LEASE": str(lease)}
        return subprocess.Popen(
            [sys.executable, str(HERE / "_lg_claim_child.py"), *argv],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def open(self, gate: str) -> None:
        """Let a process waiting in its charge go on."""
        (self.tmp / gate).touch()

    def finish(self, process: subprocess.Popen[str]) -> dict[str, Any]:
        """Wait for a process; what it printed."""
        out, _ = process.communicate(timeout=stretched(300))
        assert process.returncode == 0, out
        result: dict[str, Any] = json.loads(out)
        return result

    def count(self) -> int:
        """How many charges were made."""
        return len(self.charges.read_text().splitlines())

    def wait_for_charges(self, n: int) -> None:
        """Wait until ``n`` charges were made."""
        deadline = time.monotonic() + stretched(300)  # only a very slow machine gets near it
        while self.count() < n:
            assert time.monotonic() < deadline, f"no {n} charge(s) in 300 s"
            time.sleep(0.05)

    def checkpoints(self) -> list[Any]:
        """Every checkpoint of the thread."""
        with PostgresThreadSaver(self.dsn) as reader:
            return list(reader.list(THREAD))

    def assert_no_fork(self) -> None:
        """No checkpoint of the thread has two children."""
        children = Counter(
            c.parent_config["configurable"]["checkpoint_id"] if c.parent_config else None
            for c in self.checkpoints()
        )
        forks = {parent: n for parent, n in children.items() if n > 1}
        assert not forks, f"checkpoints with more than one child: {forks}"

    def finished(self) -> bool:
        """Whether the thread's latest checkpoint is the end of the run."""
        with PostgresThreadSaver(self.dsn) as reader:
            latest = reader.get_tuple(THREAD)
        assert latest is not None
        messages = latest.checkpoint["channel_values"]["messages"]
        return bool(messages[-1].content == "charged" and not latest.checkpoint.get("next"))


def test_two_processes_claim_one_thread_the_second_is_refused_before_any_node_runs(
    tmp_path: Path, pg_dsn: str
) -> None:
    """The first inside its charge holds the lease: the second's claim raises ThreadLocked (no
    second charge); once the first finished, a second run finds the thread done. No fork.
    """
    thread = PgThread(tmp_path, pg_dsn)
    first = thread.start("recipe", gate="gate")
    thread.wait_for_charges(1)
    second = thread.finish(thread.start("recipe"))
    assert second.get("error") == "ThreadLocked", (second, f"{thread.count()} charges")
    assert "durably_lg_threads['t']" in second["message"]
    assert thread.count() == 1
    thread.open("gate")
    assert thread.finish(first) == {"how": "ran"}
    assert thread.finish(thread.start("recipe")) == {"how": "ran"}
    assert thread.count() == 1, "the second process charged a finished thread"
    assert thread.finished()
    thread.assert_no_fork()


def test_a_stale_owners_write_is_refused_by_the_database_after_its_lease_was_taken(
    tmp_path: Path, pg_dsn: str
) -> None:
    """An owner stopped (SIGSTOP) inside its charge past its lease loses the thread to another
    process, which finishes it; woken, its next put is refused (LeaseLost) and writes nothing.
    """
    thread = PgThread(tmp_path, pg_dsn)
    stale = thread.start("recipe", gate="stale-gate", lease=1)
    thread.wait_for_charges(1)
    before = {c.config["configurable"]["checkpoint_id"] for c in thread.checkpoints()}
    os.kill(stale.pid, signal.SIGSTOP)  # its renewals stop with it: the lease runs out
    try:
        deadline = time.monotonic() + stretched(300)
        while True:
            took = thread.finish(thread.start("recipe", lease=1))
            if took == {"how": "ran"}:
                break
            assert took.get("error") == "ThreadLocked", took
            assert time.monotonic() < deadline, "the stopped owner's lease never ran out"
            time.sleep(0.2)
    finally:
        os.kill(stale.pid, signal.SIGCONT)
    after = {c.config["configurable"]["checkpoint_id"] for c in thread.checkpoints()}
    thread.open("stale-gate")
    refused = thread.finish(stale)
    assert refused.get("error") == "LeaseLost", refused
    assert "was taken over" in refused["message"]
    final = {c.config["configurable"]["checkpoint_id"] for c in thread.checkpoints()}
    assert final == after, "the stale owner's write landed"
    assert before < after
    assert thread.finished()
    thread.assert_no_fork()


def test_a_write_after_a_takeover_is_refused_in_the_database_not_only_in_this_process(
    pg_dsn: str,
) -> None:
    """The fence is the statement's WHERE: a saver that still believes it holds the thread
    (its renewal never noticed) puts after another took the lease: LeaseLost, nothing written.
    """
    with PostgresThreadSaver(pg_dsn) as first, PostgresThreadSaver(pg_dsn) as second:
        graph = build(first, rounds=1)
        graph.invoke(question(), THREAD, durability="sync")
        latest = first.get_tuple(THREAD)
        assert latest is not None
        with pytest.raises(ThreadLocked):
            second.claim("t")
        import psycopg

        with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the lease runs out
            conn.execute("UPDATE durably_lg_threads SET expires_at = now() WHERE thread_id = 't'")
        second.claim("t")
        assert second.token("t") == (first.token("t") or 0) + 1
        checkpoint: Any = {**latest.checkpoint, "id": "1f0-stale"}
        with pytest.raises(LeaseLost, match="was taken over"):
            first.put(latest.config, checkpoint, {}, {})
        with pytest.raises(LeaseLost):
            first.put_writes(latest.config, [("messages", [])], "task")
        assert (
            second.get_tuple({"configurable": {"thread_id": "t", "checkpoint_id": "1f0-stale"}})
            is None
        )


@pytest.mark.parametrize("label", ["loop.tool_returned:charge", "langgraph.put.saved"])
def test_a_keyed_tool_on_the_postgres_saver_charges_once_across_a_sigkill(
    tmp_path: Path, pg_dsn: str, label: str
) -> None:
    """SIGKILLed after the charge returned (or at the saver's first durable put), the resumed
    run sends no second request with a new key: one key at the service, and the run ends.
    """
    charges = tmp_path / "charges"
    child = [sys.executable, str(HERE / "_lg_pg_tools_child.py"), pg_dsn, str(charges)]
    killed = subprocess.run([*child, label], capture_output=True, text=True, timeout=stretched(300))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = subprocess.run([*child, "-"], capture_output=True, text=True, timeout=stretched(300))
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == {"last": "all done"}
    requests = charges.read_text().splitlines() if charges.exists() else []
    keys = {line.split()[1] for line in requests}
    assert len(keys) == 1, requests
    if label == "langgraph.put.saved":
        assert len(requests) == 1, "the charge ran again"
    # The thread is a durably run of the same database: `durably runs --dsn` lists it.
    listed = subprocess.run(
        [sys.executable, "-m", "durably", "runs", "--dsn", pg_dsn],
        capture_output=True,
        text=True,
        timeout=stretched(300),
    )
    assert listed.returncode == 0, listed.stderr
    rows = [[cell.strip() for cell in line.split("│")] for line in listed.stdout.splitlines()]
    assert any(row[1:2] == ["t"] for row in rows), listed.stdout


HOLDER = """
import asyncio, sys, time
from datetime import timedelta
from durably import frontend
from durably.postgres import PostgresStore
from durably.state import utcnow

async def hold() -> None:
    store = PostgresStore(sys.argv[1], lease=timedelta(seconds=float(sys.argv[2])))
    await frontend.open_or_create(store, "t", lambda: "LangGraph thread t", clock=utcnow)
    print("held", flush=True)
    time.sleep(600)  # blocks the loop: the lease is renewed by no one after this

asyncio.run(hold())
"""


def test_tools_wait_out_a_dead_owners_run_lease_instead_of_meeting_locked(
    tmp_path: Path, pg_dsn: str
) -> None:
    """A process holding thread ``t``'s durably run is SIGKILLed with its lease live; the graph
    run at once on the thread waits for that lease to lapse, charges once and ends.

    Both use an 8 s lease, far longer than the graph's process takes to start, so the
    run's lease is still live when its tools open the run (without the wait: ``Locked``).
    """
    lease = "8"
    with subprocess.Popen(
        [sys.executable, "-c", HOLDER, pg_dsn, lease], stdout=subprocess.PIPE, text=True
    ) as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "held"
        finally:
            holder.kill()  # SIGKILL: its run lease stays in the table, live for 8 s
    charges = tmp_path / "charges"
    child = [sys.executable, str(HERE / "_lg_pg_tools_child.py"), pg_dsn, str(charges), "-"]
    env = {**os.environ, "LG_LEASE": lease}
    done = subprocess.run(
        child, capture_output=True, text=True, timeout=stretched(300), env=env, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == {"last": "all done"}
    assert len(charges.read_text().splitlines()) == 1


def test_a_checkpoint_or_a_write_put_again_goes_as_before_and_a_first_put_is_one_statement(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put first goes with plain inserts (one statement); put again, it finds its rows and
    goes again as before: the checkpoint's row replaced, a regular write kept, a special
    write (an interrupt's) replaced.
    """
    from langgraph.checkpoint.base import empty_checkpoint

    from durably.langgraph import _pg_sql
    from durably.langgraph._postgres import PostgresThreadSaver as Saver

    sent: list[str] = []
    execute = Saver._execute  # noqa: SLF001 -- counting the statements a put sends

    def counted(self: Saver, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        sent.append(sql)
        return execute(self, sql, params)

    monkeypatch.setattr(Saver, "_execute", counted)
    config: Any = {"configurable": {"thread_id": "again", "checkpoint_ns": ""}}
    with PostgresThreadSaver(pg_dsn) as saver:
        checkpoint: Any = {**empty_checkpoint(), "channel_values": {"notes": ["a"]}}
        checkpoint["channel_versions"] = {"notes": "1"}
        saver.claim("again")
        sent.clear()
        stored = saver.put(config, checkpoint, {"step": 1}, {"notes": "1"})
        assert sent == [_pg_sql.PUT_NEW]
        sent.clear()
        saver.put(config, checkpoint, {"step": 2}, {"notes": "1"})
        assert sent == [_pg_sql.PUT_NEW, _pg_sql.PUT]
        found = saver.get_tuple(stored)
        assert found is not None
        assert found.metadata["step"] == 2
        assert found.checkpoint["channel_values"] == {"notes": ["a"]}

        sent.clear()
        saver.put_writes(stored, [("notes", "first")], "task")
        assert sent == [_pg_sql.PUT_WRITES_NEW]
        saver.put_writes(stored, [("notes", "second")], "task")
        assert sent[1:] == [_pg_sql.PUT_WRITES_NEW, _pg_sql.PUT_WRITES_KEPT]
        saver.put_writes(stored, [("__interrupt__", "asked")], "task")
        saver.put_writes(stored, [("__interrupt__", "asked again")], "task")
        found = saver.get_tuple(stored)
        assert found is not None
        assert found.pending_writes is not None
        assert sorted((c, v) for _, c, v in found.pending_writes) == [
            ("__interrupt__", "asked again"),
            ("notes", "first"),
        ]
