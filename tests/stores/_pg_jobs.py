"""A scripted job for the Postgres process tests: a ledger receiver, two tools, a registry.

The receiver is a JSON-lines file shared by every process, guarded by ``flock``
so a check and its append are one step. It honours idempotency keys (``credit``)
and fencing tokens (``note``: a request carrying a lower token than one already
seen for the run is refused, the way a storage service fences a stale lock holder).

The job's model is a :class:`durably.ScriptedModel`: credit, note, credit, note,
then the answer. Tools can be told to pause after acting (a file in the world)
so a test can stop the process with a call in flight.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import durably
from durably import (
    Agent,
    Call,
    Effect,
    Limits,
    Reply,
    ScriptedApprover,
    ScriptedModel,
    ToolContext,
    Usage,
)
from durably.postgres import Registry, current_lease
from durably.stores import Store

ANSWER = "ledger settled"
JOB = "ledger"


class Ledger:
    """The receiver: every request it served, one JSON line each, under an exclusive flock."""

    def __init__(self, root: Path) -> None:
        self.path = root / "ledger.jsonl"
        self.lock = root / "ledger.lock"

    @contextmanager
    def _locked(self) -> Iterator[list[dict[str, Any]]]:
        fd = os.open(self.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield self.entries()
        finally:
            os.close(fd)

    def entries(self) -> list[dict[str, Any]]:
        """Every request served, in order."""
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]

    def effects(self, tool: str | None = None) -> list[dict[str, Any]]:
        """Requests that changed something."""
        return [e for e in self.entries() if e["kind"] == "effect" and tool in (None, e["tool"])]

    def credit(self, *, run_id: str, call_id: str, key: str) -> str:
        with self._locked() as entries:
            for entry in entries:
                if entry["kind"] == "effect" and entry.get("key") == key:
                    self._append(kind="repeat", tool="credit", run_id=run_id, call_id=call_id)
                    return str(entry["result"])
            result = f"credited {run_id}/{call_id}"
            self._append(
                kind="effect", tool="credit", run_id=run_id, call_id=call_id, key=key, result=result
            )
            return result

    def note(self, *, run_id: str, call_id: str, text: str, token: int) -> str:
        with self._locked() as entries:
            seen = max(
                (e["token"] for e in entries if e["run_id"] == run_id and "token" in e), default=0
            )
            if token < seen:
                self._append(
                    kind="fenced", tool="note", run_id=run_id, call_id=call_id, token=token
                )
                raise PermissionError(f"fencing token {token} is older than {seen}")
            result = f"noted {run_id}/{call_id}: {text}"
            self._append(
                kind="effect",
                tool="note",
                run_id=run_id,
                call_id=call_id,
                text=text,
                token=token,
                result=result,
            )
            return result

    def find_note(self, *, run_id: str, call_id: str) -> str | None:
        with self._locked() as entries:
            for entry in entries:
                if (
                    entry["kind"] == "effect"
                    and entry["tool"] == "note"
                    and (entry["run_id"], entry["call_id"]) == (run_id, call_id)
                ):
                    return str(entry["result"])
            return None

    def _append(self, **entry: Any) -> None:
        with self.path.open("a") as out:
            out.write(json.dumps(entry) + "\n")


def make_tools(root: Path, *, dwell: float = 0.0) -> list[durably.Tool]:
    """The job's tools over the ledger in ``root``.

    ``dwell`` seconds pass after each effect (a slow service's reply). While a file
    ``root/pause`` names a tool, that tool, having acted, writes ``root/acted`` and
    waits; while it names ``<tool>:before``, the tool waits before acting and writes
    ``root/waiting``.
    """
    ledger = Ledger(root)
    pause = root / "pause"

    async def wait_while_paused(tool: str, signal: str) -> None:
        if pause.exists() and pause.read_text() == tool:
            (root / signal).touch()
            while pause.exists():  # noqa: ASYNC110 - another process removes the file
                await asyncio.sleep(0.02)

    async def after_effect(tool: str) -> None:
        if dwell:
            await asyncio.sleep(dwell)
        await wait_while_paused(tool, "acted")

    @durably.tool(effect=Effect.KEYED, key_ttl=durably.NEVER_EXPIRES)
    async def credit(ctx: ToolContext, account: str) -> str:
        """Credit an account; the ledger deduplicates by idempotency key."""
        result = await asyncio.to_thread(
            ledger.credit, run_id=ctx.run_id, call_id=ctx.call_id, key=ctx.idempotency_key
        )
        await after_effect("credit")
        return result

    async def find_note(ctx: ToolContext, text: str) -> durably.Lookup:
        found = await asyncio.to_thread(ledger.find_note, run_id=ctx.run_id, call_id=ctx.call_id)
        return durably.NOT_FOUND if found is None else durably.Found(found)

    @durably.tool(effect=Effect.WRITE, lookup=find_note)
    async def note(ctx: ToolContext, text: str) -> str:
        """Write a note to the ledger (no key: a repeat would write it twice)."""
        lease = current_lease()
        if lease is None or lease.run_id != ctx.run_id:
            raise RuntimeError("no lease for this run in this task")
        await wait_while_paused("note:before", "waiting")
        result = await asyncio.to_thread(
            ledger.note, run_id=ctx.run_id, call_id=ctx.call_id, text=text, token=lease.token
        )
        await after_effect("note")
        return result

    return [credit, note]


def script() -> list[Reply]:
    """Credit, note, credit, note, answer."""
    usage = Usage(input_tokens=100, output_tokens=10)
    return [
        Reply(calls=[Call("c1", "credit", '{"account": "a-1"}')], usage=usage),
        Reply(calls=[Call("n1", "note", '{"text": "first"}')], usage=usage),
        Reply(calls=[Call("c2", "credit", '{"account": "a-2"}')], usage=usage),
        Reply(calls=[Call("n2", "note", '{"text": "second"}')], usage=usage),
        Reply(text=ANSWER, usage=usage),
    ]


CALLS = ("c1", "n1", "c2", "n2")


def make_agent(root: Path, store: Store | None = None, *, dwell: float = 0.0) -> Agent:
    """The job's agent over the world in ``root`` (with no store, for a worker to drive)."""
    return Agent(
        model=ScriptedModel(script(), log=root / "model-calls.jsonl"),
        tools=make_tools(root, dwell=dwell),
        store=store,
        approver=ScriptedApprover(),
        system="You keep the ledger.",
        # The nemesis interrupts a run many times; each claim counts as a restart.
        limits=Limits(max_resumes=100),
    )


def make_registry(root: Path, *, dwell: float = 0.0) -> Registry:
    """A registry holding the job as ``ledger``."""
    registry = Registry()
    factory: Callable[[str], Agent] = lambda run_id: make_agent(root, dwell=dwell)  # noqa: E731
    registry.register(JOB, factory, task="settle the ledger")
    return registry
