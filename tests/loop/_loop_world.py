"""The world the loop tests run in: a receiver that counts effects, scripted jobs, forked children.

A *world* is one temp directory holding everything a run touches: the state
directory, the workspace, the receiver's ledger, the model's call log, the
approver's question log and a clock file. Every process builds its agent afresh
from a :class:`Job` and sees the world only through those files, as a restarted
production process would.

Children are forked from the warm test process: the sweep alone starts over two
hundred of them, and a fresh interpreter importing durably for each would
dominate the suite's runtime. A child never returns into pytest: it leaves with
``os._exit``, or dies by the SIGKILL its :class:`CrashPlan` sends.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import durably
from durably import (
    Agent,
    Call,
    CallLog,
    Effect,
    FileStore,
    Limits,
    Model,
    Outcome,
    Price,
    Reply,
    RunState,
    ScriptedApprover,
    ScriptedModel,
    Tool,
    ToolContext,
    Usage,
    Workspace,
)
from durably.faults import CrashPlan, installed
from durably.state import AssistantMessage, ToolCall, ToolResult
from durably.stores import Store

START = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
KEY_TTL = timedelta(hours=1)
TASK = "settle the accounts"
SYSTEM = "You settle customer accounts."
ANSWER = "all accounts settled"
PERSON_SAYS = "a person checked: it happened"
CHILD_SECONDS = 60
"""A child that runs longer than this is hung; SIGALRM ends it so the test fails, not hangs."""

TURN_USAGE = Usage(input_tokens=100, output_tokens=20)


class Receiver:
    """The service behind the tools: a JSON-lines ledger of every request it served.

    ``keyed`` applies an effect once per idempotency key while the key is younger
    than the TTL (a repeat returns the first result, as Stripe does); ``write``
    applies every request; ``find`` searches the applied writes by content, and is
    certain because each request is on the ledger before its tool returns. Every
    entry names the call that sent it, so a test can count per call.
    """

    def __init__(self, path: Path, clock: Callable[[], datetime]) -> None:
        self.path = path
        self.clock = clock

    def entries(self) -> list[dict[str, Any]]:
        """Every request served, in order."""
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]

    def requests(self, call_id: str) -> list[dict[str, Any]]:
        """Every request one call sent (effects, repeats, reads, puts)."""
        return [e for e in self.entries() if e["call_id"] == call_id]

    def effects(self, tool: str | None = None) -> list[dict[str, Any]]:
        """Requests that changed something (a repeat of a known key does not)."""
        return [
            e
            for e in self.entries()
            if e["kind"] == "effect" and (tool is None or e["tool"] == tool)
        ]

    def read(self, *, call_id: str, item: str) -> str:
        self._append(kind="read", tool="read", call_id=call_id, payload=item)
        return f"{item}: 12 in stock"

    def put(self, *, call_id: str, path: str) -> None:
        self._append(kind="put", tool="idempotent", call_id=call_id, payload=path)

    def keyed(self, *, call_id: str, key: str, payload: str, ttl: timedelta | None) -> str:
        now = self.clock()
        for entry in self.effects("keyed"):
            live = ttl is None or now - datetime.fromisoformat(entry["at"]) < ttl
            if entry["key"] == key and live:
                self._append(kind="repeat", tool="keyed", call_id=call_id, key=key, payload=payload)
                return str(entry["result"])
        result = f"receipt {len(self.effects('keyed')) + 1}: {payload}"
        self._append(
            kind="effect", tool="keyed", call_id=call_id, key=key, payload=payload, result=result
        )
        return result

    def write(self, *, call_id: str, payload: str) -> str:
        result = f"filed {len(self.effects('write')) + 1}: {payload}"
        self._append(kind="effect", tool="write", call_id=call_id, payload=payload, result=result)
        return result

    def find(self, payload: str) -> str | None:
        for entry in self.effects("write"):
            if entry["payload"] == payload:
                return str(entry["result"])
        return None

    def _append(self, **entry: Any) -> None:
        entry["at"] = self.clock().isoformat()
        line = (json.dumps(entry) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, line)  # one write per line: a SIGKILL never leaves half of one
        finally:
            os.close(fd)


@dataclass(frozen=True)
class World:
    """One temp directory holding everything a run touches."""

    root: Path
    _stores: list[FileStore] = field(default_factory=list, compare=False, repr=False)

    @classmethod
    def make(cls, root: Path) -> World:
        root.mkdir(parents=True)
        world = cls(root)
        world.clock_file.write_text(START.isoformat())
        return world

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def workspace_dir(self) -> Path:
        return self.root / "workspace"

    @property
    def ledger(self) -> Path:
        return self.root / "ledger.jsonl"

    @property
    def model_log(self) -> Path:
        return self.root / "model-calls.jsonl"

    @property
    def question_log(self) -> Path:
        return self.root / "questions.jsonl"

    @property
    def clock_file(self) -> Path:
        return self.root / "clock"

    def now(self) -> datetime:
        """The world's time: what the agent, its markers and the receiver all read."""
        return datetime.fromisoformat(self.clock_file.read_text())

    def advance(self, delta: timedelta) -> None:
        self.clock_file.write_text((self.now() + delta).isoformat())

    def receiver(self) -> Receiver:
        return Receiver(self.ledger, self.now)

    def store(self) -> FileStore:
        """A file store on the world's state directory (no fsync: no power loss is modelled)."""
        store = FileStore(self.runs, sync=False)
        self._stores.append(store)
        return store

    def workspace(self) -> Workspace:
        return Workspace(self.workspace_dir, sync=False)

    def model_turns(self) -> list[int]:
        """Every turn the model was asked for, by any process, in order."""
        return CallLog(self.model_log).turns()

    def questions(self, kind: str) -> list[str]:
        """Call IDs the approver was asked about (``approve`` or ``resolve``), by any process."""
        if not self.question_log.exists():
            return []
        asked = [json.loads(line) for line in self.question_log.read_text().splitlines()]
        return [q["call_id"] for q in asked if q["kind"] == kind]

    def run_ids(self) -> list[str]:
        store = FileStore(self.runs, sync=False)
        try:
            return store.list_runs_sync()
        finally:
            store.close_sync()

    def run_id(self) -> str:
        """The world's one run."""
        (run_id,) = self.run_ids()
        return run_id

    def state(self, run_id: str | None = None) -> RunState:
        """The run's state as a fresh process would load it (without taking the lock)."""
        store = FileStore(self.runs, sync=False)
        try:
            return store.read_sync(run_id or self.run_id())
        finally:
            store.close_sync()

    def close(self) -> None:
        for store in self._stores:
            store.close_sync()


# -- tools ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Toolset:
    """How the four tools are declared in one job."""

    key_ttl: timedelta | None = KEY_TTL
    write_lookup: Literal["certain", "unknown", "raises", "none"] = "certain"
    """``certain`` (searches the ledger), ``unknown``, ``raises`` or ``none``."""
    write_needs_approval: bool = False
    write_effect: Effect = Effect.WRITE


def make_tools(world: World, toolset: Toolset) -> list[Tool]:
    """The job's tools: ``read``, ``idempotent``, ``keyed`` and ``write``, bound to the world."""
    receiver = world.receiver()

    @durably.tool(effect=Effect.READ)
    async def read(ctx: ToolContext, item: str) -> str:
        """How many of an item are in stock."""
        return receiver.read(call_id=ctx.call_id, item=item)

    async def files_of(ctx: ToolContext, path: str, text: str) -> Mapping[str, str]:
        return {path: text}

    @durably.tool(effect=Effect.IDEMPOTENT, intends=files_of)
    async def idempotent(ctx: ToolContext, path: str, text: str) -> str:
        """Write a note into the workspace; writing the same note again changes nothing."""
        if ctx.workspace is None:
            raise RuntimeError("the agent has no workspace")
        receiver.put(call_id=ctx.call_id, path=path)
        digest = ctx.workspace.write(path, text)
        return f"wrote {path} ({digest[:12]})"

    @durably.tool(
        effect=Effect.KEYED,
        key_ttl=durably.NEVER_EXPIRES if toolset.key_ttl is None else toolset.key_ttl,
    )
    async def keyed(ctx: ToolContext, order: str, cents: int) -> str:
        """Refund an order; the payment service deduplicates on the idempotency key."""
        return receiver.keyed(
            call_id=ctx.call_id,
            key=ctx.idempotency_key,
            payload=f"refund {order} {cents}",
            ttl=toolset.key_ttl,
        )

    async def certain(ctx: ToolContext, note: str) -> durably.Lookup:
        found = receiver.find(f"note {note}")
        return durably.NOT_FOUND if found is None else durably.Found(found)

    async def unknown(ctx: ToolContext, note: str) -> durably.Lookup:
        return durably.UNKNOWN

    async def raises(ctx: ToolContext, note: str) -> durably.Lookup:
        raise ConnectionError("the search index is down")

    lookups = {"certain": certain, "unknown": unknown, "raises": raises, "none": None}

    @durably.tool(
        effect=toolset.write_effect,
        key_ttl=None,
        needs_approval=toolset.write_needs_approval,
        lookup=lookups[toolset.write_lookup],
    )
    async def write(ctx: ToolContext, note: str) -> str:
        """File a note in the tracker (no idempotency key)."""
        return receiver.write(call_id=ctx.call_id, payload=f"note {note}")

    return [read, idempotent, keyed, write]


class RecordingModel(ScriptedModel):
    """A scripted model that keeps every request it was sent (what the model saw)."""

    def __init__(self, replies: Sequence[Reply], **kwargs: Any) -> None:
        super().__init__(replies, **kwargs)
        self.requests: list[durably.ModelRequest] = []

    async def reply(self, request: durably.ModelRequest) -> Reply:
        self.requests.append(request)
        return await super().reply(request)


# -- jobs -----------------------------------------------------------------------------


def reply(*calls: tuple[str, str, str], text: str | None = None) -> Reply:
    """A scripted reply: ``(call ID, tool, raw arguments)`` for each call."""
    return Reply(text=text, calls=[Call(*call) for call in calls], usage=TURN_USAGE)


def answer(text: str = ANSWER) -> Reply:
    """A scripted final answer."""
    return Reply(text=text, usage=TURN_USAGE)


@dataclass(frozen=True, kw_only=True)
class Job:
    """Everything needed to build the same agent in any process."""

    replies: tuple[Reply, ...]
    toolset: Toolset = Toolset()
    limits: Limits | None = None
    approve: tuple[durably.Yes | durably.No, ...] = ()
    resolve: tuple[durably.Rerun | durably.Done, ...] = ()
    system: str = SYSTEM
    fickle: bool = False
    price: Price | None = None
    allow_agent_change: bool = False
    approver_class: type[ScriptedApprover] = ScriptedApprover
    """Subclass it to make the approver do more (hit a crash point while asked, defer)."""

    def model(self, world: World) -> ScriptedModel:
        return ScriptedModel(
            self.replies, log=world.model_log, fickle=self.fickle, price=self.price
        )

    def approver(self, world: World) -> ScriptedApprover:
        return self.approver_class(
            approve=self.approve, resolve=self.resolve, log=world.question_log
        )

    def agent(
        self,
        world: World,
        *,
        model: Model | None = None,
        approver: durably.Approver | None = None,
        store: Store | None = None,
    ) -> Agent:
        return Agent(
            model=model or self.model(world),
            tools=make_tools(world, self.toolset),
            store=store or world.store(),
            limits=self.limits,
            approver=approver or self.approver(world),
            system=self.system,
            workspace=world.workspace(),
            clock=world.now,
            allow_agent_change=self.allow_agent_change,
        )


# -- children -------------------------------------------------------------------------


@dataclass(frozen=True)
class Child:
    """How a forked child ended: its exit code (-9 for SIGKILL) and what it reported."""

    returncode: int
    value: Any = None
    error: str | None = None
    """The exception's type name when the child's work raised."""
    message: str = ""

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL

    def finished(self) -> dict[str, Any]:
        """The outcome the child reported; fails the test with the child's error if it has none."""
        if self.returncode != 0:
            raise AssertionError(
                f"the child ended with {self.returncode}: {self.error}: {self.message}"
            )
        return dict(self.value)


def in_child(work: Callable[[], Any]) -> Child:
    """Run ``work`` in a child forked from this process and wait for it to end."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: whatever happens, leave by os._exit, never back into pytest
        status = 70
        try:
            os.close(read_fd)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(CHILD_SECONDS)
            try:
                report: dict[str, Any] = {"value": work()}
                status = 0
            except Exception as exc:  # noqa: BLE001 - the child reports any error to the parent test
                report = {
                    "error": type(exc).__name__,
                    "message": str(exc),
                    "traceback": traceback.format_exc(),
                }
                status = 1
            data = memoryview(json.dumps(report).encode())
            while data:
                data = data[os.write(write_fd, data) :]
        finally:
            os._exit(status)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        written = pipe.read()
    _, wait_status = os.waitpid(pid, 0)
    report = json.loads(written) if written else {}
    return Child(
        returncode=os.waitstatus_to_exitcode(wait_status),
        value=report.get("value"),
        error=report.get("error"),
        message=report.get("message", "") + report.get("traceback", ""),
    )


def summary(outcome: Outcome) -> dict[str, Any]:
    """What a child reports about an outcome."""
    return {
        "run_id": outcome.run_id,
        "status": outcome.status,
        "answer": outcome.answer,
        "pending": [p.call_id for p in outcome.pending],
    }


@contextmanager
def _maybe(plan: CrashPlan | None) -> Iterator[None]:
    with installed(plan) if plan is not None else nullcontext():
        yield


def start(world: World, job: Job, *, plan: CrashPlan | None = None) -> Child:
    """A child starts a new run of the job (dying where ``plan`` says)."""

    def work() -> dict[str, Any]:
        with _maybe(plan):
            return summary(asyncio.run(job.agent(world).run(TASK, name="job")))

    return in_child(work)


def resume(world: World, job: Job, *, plan: CrashPlan | None = None) -> Child:
    """A child resumes the world's run (dying where ``plan`` says)."""

    def work() -> dict[str, Any]:
        with _maybe(plan):
            return summary(asyncio.run(job.agent(world).resume(world.run_id())))

    return in_child(work)


def carry_on(world: World, job: Job) -> Child:
    """A child resumes the world's run, or starts it again if no state of it was ever saved."""
    return resume(world, job) if world.run_ids() else start(world, job)


def record(world: World, job: Job) -> tuple[list[str], Child]:
    """Run the job once in a child without crashing; every crash point it reached, in order."""

    def work() -> dict[str, Any]:
        plan = CrashPlan()
        with installed(plan):
            outcome = asyncio.run(job.agent(world).run(TASK, name="job"))
        return {"labels": plan.reached, "outcome": summary(outcome)}

    child = in_child(work)
    if child.returncode != 0:
        raise AssertionError(f"the recording run failed: {child.error}: {child.message}")
    return list(child.value["labels"]), child


def tool_results(state: RunState) -> list[tuple[str, str, bool]]:
    """Every tool result of the run: (call ID, content, is_error), in order."""
    return [(m.call_id, m.content, m.is_error) for m in state.messages if isinstance(m, ToolResult)]


def calls(state: RunState) -> list[ToolCall]:
    """Every tool call of every saved reply, in order."""
    return [call for m in state.messages if isinstance(m, AssistantMessage) for call in m.calls]


def script(replies: Sequence[Reply]) -> list[Call]:
    """Every call of a script, in order."""
    return [call for r in replies for call in r.calls]
