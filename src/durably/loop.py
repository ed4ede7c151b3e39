"""The durable agent loop: phases, the five save points, limits, approvals, the ladder.

:class:`Agent` runs a model and its tools against a store. ``run(task)`` starts
a run; ``resume(run_id)`` carries one on in any later process. The loop writes
the state at five save points (docs/concepts.md, "Save points"):

1. start: a new run, before the first model call;
2. reply: a model reply with its call IDs and usage, before any call runs;
3. attempt: an attempt marker, just before each call that can change something
   (after the approver's yes, for calls that need one);
4. result: each call's result, with its marker cleared;
5. pause / done: a call waiting for a person; the final answer.

A restart never asks again for a saved reply, runs only the saved reply's
unanswered calls, and sends every call that has a marker to the ladder instead
of running it blindly. Every save is shielded: a cancellation waits for the save
in flight and then propagates.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, TypeVar

from . import _declarations, faults, ladder
from ._values import describe, exception_text, text_problem
from .approval import DEFER, ApprovalRequest, Approver, Done, No, Rerun, ScriptedApprover, Yes
from .errors import (
    AgentChanged,
    ApprovalUnavailable,
    DollarLimit,
    InvalidValue,
    LimitExceeded,
    MaxResumes,
    ModelError,
    TokenLimit,
    TurnLimit,
)
from .keys import idempotency_key, new_run_id, validate_run_id
from .models import (
    Delta,
    Model,
    ModelRequest,
    ToolSpec,
    WorstCase,
    checked_reply,
    priced,
    worst_case,
)
from .state import (
    Approval,
    ApprovalKind,
    AssistantMessage,
    AttemptMarker,
    Decision,
    Effect,
    Fingerprint,
    Message,
    ModelCall,
    Phase,
    Resolution,
    ResolutionOutcome,
    RunState,
    ToolCall,
    ToolPrint,
    ToolResult,
    UserMessage,
    utcnow,
)
from .stores import RunHandle, Store
from .tools import KeyNotSent, Tool, ToolContext, ToolInDoubt, ToolInputError, ToolResultError
from .workspace import Workspace, sha256_bytes

__all__ = ["Agent", "ContextPolicy", "Event", "EventKind", "Limits", "Outcome", "shielded"]

log = logging.getLogger("durably.loop")
_T = TypeVar("_T")


async def shielded(awaitable: Awaitable[_T]) -> _T:
    """Await ``awaitable`` to completion even if the caller is cancelled meanwhile.

    The cancellation is re-raised once the work has finished, so a save that
    records where a run stopped always lands before the task unwinds.
    """
    import asyncio  # imported where it runs: `import durably` stays light (issue 19)

    task = asyncio.ensure_future(awaitable)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Limits over a run's whole life, across every process that ran it."""

    max_turns: int | None = None
    max_tokens: int | None = None
    max_dollars: float | None = None
    max_resumes: int = 10

    def __post_init__(self) -> None:
        _declarations.check_limit_fields(self)
        # A limit nothing can stay under (or, for NaN, that nothing ever reaches)
        # is a mistake, not a policy: refuse it before a run is started with it.
        for name in ("max_turns", "max_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(
                    f"Limits.{name} must be 1 or more (or None for no limit), got {value}"
                )
        if self.max_dollars is not None and not 0 < self.max_dollars < math.inf:
            raise ValueError(
                f"Limits.max_dollars must be a positive amount (or None for no limit), "
                f"got {self.max_dollars}"
            )
        if self.max_resumes < 0:
            raise ValueError(f"Limits.max_resumes must be 0 or more, got {self.max_resumes}")


def _default_summary(previous: str | None, dropped: Sequence[Message]) -> str:
    """A plain, deterministic account of dropped history."""
    lines = [previous] if previous else []
    for message in dropped:
        if isinstance(message, UserMessage):
            lines.append(f"user: {message.text[:200]}")
        elif isinstance(message, AssistantMessage):
            calls = ", ".join(f"{c.name}({c.arguments[:80]})" for c in message.calls)
            lines.append(f"assistant: {(message.text or '')[:200]} {calls}".rstrip())
        else:
            lines.append(f"result of {message.name}: {message.content[:200]}")
    return "\n".join(lines)


@dataclass(frozen=True, kw_only=True)
class ContextPolicy:
    """Replace old history with a summary once the conversation grows past a size.

    The summary lives in the state, so a resumed run sends the model exactly the
    context the dead process would have sent.
    """

    max_messages: int = 200
    """Summarize when ``messages`` grows past this many."""
    keep: int = 40
    """Keep at least this many recent messages verbatim."""
    summarize: Callable[[str | None, Sequence[Message]], str] = _default_summary

    def apply(self, state: RunState) -> bool:
        """Fold old messages into the summary if needed; True when the state changed."""
        if len(state.messages) <= self.max_messages:
            return False
        cut = len(state.messages) - self.keep
        # Never split a reply from its results: cut just before an assistant or user message.
        while cut > 0 and isinstance(state.messages[cut], ToolResult):
            cut -= 1
        if cut <= 0:
            return False
        dropped = state.messages[:cut]
        try:
            summary = self.summarize(state.summary, dropped)
        except Exception:
            # The summary is user code: if it fails, keep the history whole rather than
            # lose a result that is about to be saved; the next result tries again.
            log.exception("context policy: summarize raised; history kept whole for now")
            return False
        if problem := text_problem(summary):
            log.error("context policy: summarize returned unusable text (%s)", problem)
            return False
        state.summary = summary
        state.summarized += len(dropped)
        state.messages = state.messages[cut:]
        return True


EventKind = Literal[
    "started",
    "resumed",
    "reply",
    "call",
    "in-doubt",
    "result",
    "approval",
    "approved",
    "refused",
    "unavailable",
    "ladder",
    "paused",
    "done",
    "text-delta",
    "arguments-delta",
]
"""Every kind of :class:`Event` the loop emits (``Event``'s docstring says what each carries)."""


@dataclass(frozen=True, kw_only=True)
class Event:
    """Something the loop did, for live output (the CLI) and tests.

    Kinds, with what ``data`` holds:

    - ``started`` (``task``): a new run was saved (save point 1);
    - ``resumed`` (``phase``, ``turns``, ``resumes``): this process took a run over;
    - ``reply`` (``turn``, ``text``, ``calls`` as (call ID, tool) pairs, ``dollars``):
      a model reply was saved (save point 2);
    - ``call`` (``call_id``, ``tool``, ``effect``): a tool call starts;
    - ``in-doubt`` (``call_id``, ``tool``, ``reason``): a tool sent a request and got
      no answer (``ToolInDoubt``); the ladder settles the call;
    - ``result`` (``call_id``, ``tool``, ``is_error``, ``content``): a call's result was saved;
    - ``approval`` (``call_id``, ``tool``): the approver is asked about a call;
    - ``approved`` / ``refused`` (``call_id``, ``tool``): its answer;
    - ``unavailable`` (``call_id``, ``tool``, ``reason``): the approver could not be
      asked; the run pauses with the question saved;
    - ``ladder`` (``call_id``, ``tool``, ``step``, ``outcome``): an in-doubt call's verdict;
    - ``paused`` (``pending``: call IDs): the run waits for a person (save point 5);
    - ``done`` (``answer``, ``turns``, ``dollars``): the answer was saved (save point 5);
    - from a streaming model, before its ``reply``: ``text-delta`` (``turn``, ``text``)
      and ``arguments-delta`` (``turn``, ``call_id``, ``tool``, ``text``), sent to the
      observer only, never logged.
    """

    kind: EventKind
    """One of :data:`EventKind`."""
    run_id: str
    data: Mapping[str, Any] = field(default_factory=dict)


OutcomeStatus = Literal["done", "paused"]

# Where each field of Outcome comes from in the state; a test holds the two in step.
OUTCOME_SOURCES: Mapping[str, str] = {
    "run_id": "run_id",
    "status": "phase",
    "answer": "answer",
    "stop_reason": "stop_reason",
    "turns": "turns",
    "dollars": "dollars",
    "pending": "pending",
    "state": "*",
}


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What a call to ``run`` or ``resume`` ended with. Everything in it comes from the state."""

    run_id: str
    status: OutcomeStatus
    answer: str | None
    stop_reason: str | None
    turns: int
    dollars: float
    pending: tuple[Approval, ...]
    """Questions waiting for a person when ``status`` is ``paused``."""
    state: RunState

    @classmethod
    def from_state(cls, state: RunState) -> Outcome:
        """The outcome a saved state stands for."""
        return cls(
            run_id=state.run_id,
            status="done" if state.phase is Phase.DONE else "paused",
            answer=state.answer,
            stop_reason=state.stop_reason,
            turns=state.turns,
            dollars=state.dollars,
            pending=tuple(state.pending.values()),
            state=state,
        )


Decisions = Mapping[str, Yes | No | Rerun | Done]


class Agent:
    """A model, its tools and a store, run durably.

    Args:
        model: writes the replies.
        tools: what the model may call.
        store: where runs live; :meth:`run` and :meth:`resume` need one. An agent
            only ever given its runs' handles (:meth:`start`, :meth:`drive`: a
            Postgres worker's agents) needs none.
        limits: turn, token, dollar and resume limits over each run's life.
        approver: answers approval and in-doubt questions. Required when a tool
            needs approval (``TerminalApprover``, ``AskLater``, or
            ``PolicyApprover`` to approve every call); without one, an in-doubt
            call a person must settle leaves the run paused with its question.
        system: the system prompt.
        context_policy: how long history is folded into a summary.
        workspace: the directory tools write files through.
        clock: the time source for markers and key ages.
        allow_agent_change: resume runs started with a different agent.
        observer: called with every :class:`Event`.
    """

    def __init__(
        self,
        *,
        model: Model,
        tools: Iterable[Tool],
        store: Store | None = None,
        limits: Limits | None = None,
        approver: Approver | None = None,
        system: str = "",
        context_policy: ContextPolicy | None = None,
        workspace: Workspace | None = None,
        clock: Callable[[], datetime] = utcnow,
        allow_agent_change: bool = False,
        observer: Callable[[Event], None] | None = None,
    ) -> None:
        _declarations.check_model(model)
        self.model = model
        self.tools = _declarations.checked_tools(tools)
        _declarations.check_approver(approver, self.tools.values())
        self.store = store
        self.limits = limits or Limits()
        self.approver: Approver = approver or ScriptedApprover()
        self.system = system
        self.context_policy = context_policy
        self.workspace = workspace
        self.clock = clock
        self.allow_agent_change = allow_agent_change
        self.observer = observer

    def fingerprint(self) -> Fingerprint:
        """What this agent is, as recorded in runs it starts."""
        return Fingerprint(
            model=self.model.name,
            system_sha256=hashlib.sha256(self.system.encode()).hexdigest(),
            tools=tuple(
                ToolPrint(
                    name=t.name,
                    effect=t.effect,
                    schema_sha256=t.schema_sha256,
                    needs_approval=t.needs_approval,
                )
                for t in sorted(self.tools.values(), key=lambda t: t.name)
            ),
        )

    async def run(
        self, task: str, *, name: str | None = None, run_id: str | None = None
    ) -> Outcome:
        """Start a new run of ``task`` and drive it until it is done or paused.

        Args:
            task: the user's request, the first message the model sees.
            name: a short name for the task, used as the run ID's prefix.
            run_id: use this ID instead of a new one (``RunExists`` if it was used).

        Raises:
            InvalidRunId: ``run_id`` is given but not a valid run ID (an empty one too).
            InvalidValue: ``task`` is not text the state can hold.
        """
        self._check_task(task, source="Agent.run(task)")
        if run_id is not None:
            # An empty ID is a mistake, not a request for a new one.
            validate_run_id(run_id)
        state = self._new_state(task, run_id if run_id is not None else new_run_id(name or task))
        handle = await self._the_store().create(state)  # save point 1: start
        try:
            return await self._drive_new(handle, state)
        finally:
            await shielded(handle.close())

    async def start(self, handle: RunHandle, task: str) -> Outcome:
        """Start a new run of ``task`` on ``handle``, which owns a run ID with no state yet.

        For a process that took a new run's ID by its own means (a Postgres worker
        claiming a submitted run): the first state is saved through ``handle``
        (save point 1) and the run is driven until it is done or paused. The caller
        owns ``handle`` and closes it; this agent's store is not used.

        Raises:
            InvalidValue: ``task`` is not text the state can hold.
        """
        self._check_task(task, source="Agent.start(task)")
        state = self._new_state(task, handle.run_id)
        await shielded(handle.save(state))  # save point 1: start
        return await self._drive_new(handle, state)

    async def resume(self, run_id: str, *, decisions: Decisions | None = None) -> Outcome:
        """Carry a run on from its last save, in this process.

        Args:
            run_id: the run to resume.
            decisions: answers to questions a paused run is waiting for, by call
                ID: ``Yes()``/``No(reason)`` for approvals, ``Rerun()``/``Done(result)``
                for in-doubt calls.
        """
        handle, state = await self._the_store().open(run_id)
        try:
            return await self.drive(handle, state, decisions=decisions)
        finally:
            await shielded(handle.close())

    async def drive(
        self, handle: RunHandle, state: RunState, *, decisions: Decisions | None = None
    ) -> Outcome:
        """Carry a run on from ``state``, its last save, through ``handle``.

        This is :meth:`resume` after the store's ``open``, for a caller that holds
        the run's handle itself (a Postgres worker's claim, a store chosen by a
        command): the restart is counted, the agent and the workspace checked, and
        the run driven until it is done or paused. The caller owns ``handle`` and
        closes it; this agent's store is not used.

        Args:
            handle: owns the run; every save goes through it.
            state: the run's state as ``handle``'s open loaded it.
            decisions: answers to questions a paused run is waiting for (see :meth:`resume`).

        Raises:
            ValueError: ``state`` is not the state of ``handle``'s run.
        """
        if state.run_id != handle.run_id:
            raise ValueError(f"the state of run {state.run_id!r} given with run {handle.run_id!r}")
        if self.workspace is not None:
            # The owner clears what a killed write left before anything reads the files.
            self.workspace.remove_temp_files()
        if state.phase is Phase.DONE:
            return Outcome.from_state(state)  # finished: free, no model or tool call
        driver = _Driver(self, handle, state)
        await driver.count_resume()
        self._check_agent(state)
        self._check_workspace(state)
        await driver.apply_decisions(decisions or {})
        return await driver.drive()

    def run_sync(self, task: str, *, name: str | None = None, run_id: str | None = None) -> Outcome:
        """Blocking form of :meth:`run` for scripts."""
        import asyncio

        return asyncio.run(self.run(task, name=name, run_id=run_id))

    def resume_sync(self, run_id: str, *, decisions: Decisions | None = None) -> Outcome:
        """Blocking form of :meth:`resume` for scripts."""
        import asyncio

        return asyncio.run(self.resume(run_id, decisions=decisions))

    def _the_store(self) -> Store:
        if self.store is None:
            raise ValueError(
                "this agent has no store: build it with store=..., or give it the run's "
                "handle with Agent.start or Agent.drive"
            )
        return self.store

    @staticmethod
    def _check_task(task: str, *, source: str) -> None:
        if problem := text_problem(task):
            raise InvalidValue(source=source, reason=problem, remedy="pass the task as text")

    def _new_state(self, task: str, run_id: str) -> RunState:
        return RunState(
            run_id=run_id,
            task=task,
            created_at=self.clock(),
            messages=[UserMessage(text=task)],
            fingerprint=self.fingerprint(),
        )

    async def _drive_new(self, handle: RunHandle, state: RunState) -> Outcome:
        """Drive a run whose first state was just saved (save point 1)."""
        faults.point("loop.saved.start")
        driver = _Driver(self, handle, state)
        driver.emit("started", task=state.task)
        return await driver.drive()

    def _check_agent(self, state: RunState) -> None:
        saved = state.fingerprint
        if saved is None or self.allow_agent_change:
            return
        differences = _differences(saved, self.fingerprint())
        if differences:
            raise AgentChanged(run_id=state.run_id, differences=differences)

    def _check_workspace(self, state: RunState) -> None:
        if self.workspace is None or not state.workspace:
            return
        accepted: dict[str, set[str]] = {}
        for marker in state.markers.values():  # an in-doubt write may or may not have landed
            for path, digest in marker.intended.items():
                accepted.setdefault(path, set()).add(digest)
        self.workspace.verify(state.workspace, run_id=state.run_id, also_accept=accepted)


def _differences(saved: Fingerprint, now: Fingerprint) -> list[str]:
    found = []
    if saved.model != now.model:
        found.append(f"model {saved.model!r} -> {now.model!r}")
    if saved.system_sha256 != now.system_sha256:
        found.append("system prompt changed")
    before = {t.name: t for t in saved.tools}
    after = {t.name: t for t in now.tools}
    for name in sorted(before.keys() - after.keys()):
        found.append(f"tool {name!r} removed")
    for name in sorted(after.keys() - before.keys()):
        found.append(f"tool {name!r} added")
    for name in sorted(before.keys() & after.keys()):
        old, new = before[name], after[name]
        if old.effect != new.effect:
            found.append(f"tool {name!r} effect {old.effect} -> {new.effect}")
        if old.schema_sha256 != new.schema_sha256:
            found.append(f"tool {name!r} arguments changed")
        if old.needs_approval != new.needs_approval:
            found.append(f"tool {name!r} approval {old.needs_approval} -> {new.needs_approval}")
    return found


class _Driver:
    """One process's hold on one run: moves it from phase to phase, saving as it goes."""

    def __init__(self, agent: Agent, handle: RunHandle, state: RunState) -> None:
        self.agent = agent
        self.handle = handle
        self.state = state
        self._open: dict[str, ToolCall] | None = None
        """The newest reply's unanswered calls (see :meth:`open_calls`)."""
        self._warned_unbounded = False

    # -- plumbing --------------------------------------------------------------------

    async def save(self, label: str) -> None:
        # A save with nothing to wait for (a store that does not sync) is made at once: a
        # call no cancellation can interrupt, so it needs no task and no shield.
        at_once = getattr(self.handle, "save_without_waiting", None)
        if at_once is None or not at_once(self.state):
            await shielded(self.handle.save(self.state))
        faults.point(f"loop.saved.{label}")

    def emit(self, kind: EventKind, **data: Any) -> None:
        ladder.announce(kind, self.state.run_id, data)  # verdicts and approvals, one line each
        call_id = data.get("call_id")
        log.info(
            "%s %s",
            kind,
            data,
            extra={"run_id": self.state.run_id, "phase": str(self.state.phase), "call_id": call_id},
        )
        if self.agent.observer is not None:
            try:
                self.agent.observer(Event(kind=kind, run_id=self.state.run_id, data=data))
            except Exception:
                # The observer only watches: a failing display must not stop the run.
                log.exception("observer raised on %s; the run goes on", kind)

    def stream(self, turn: int, delta: Delta) -> None:
        # To the observer only: a log line per streamed piece would drown the log.
        if self.agent.observer is not None:
            data = {"turn": turn, **delta.data()}
            try:
                self.agent.observer(Event(kind=delta.kind, run_id=self.state.run_id, data=data))
            except Exception:
                log.exception("observer raised on %s; the run goes on", delta.kind)

    def context(self, call: ToolCall, intended: Mapping[str, str] | None = None) -> ToolContext:
        return ToolContext(
            run_id=self.state.run_id,
            call_id=call.id,
            idempotency_key=idempotency_key(self.state.run_id, call.id),
            workspace=self.agent.workspace,
            clock=self.agent.clock,
            intended=dict(intended or {}),
        )

    # -- resume ----------------------------------------------------------------------

    async def count_resume(self) -> None:
        """Count and save this restart before anything else happens.

        A run whose last save was a pause is waiting for a person, not crashing:
        opening it again is not a restart (docs/concepts.md, "Limits"), and nothing is saved.
        A model call marker left by a process that died waiting for its reply is
        counted here at its worst case, saved with the count.
        """
        state = self.state
        if state.phase is Phase.PAUSED:
            self.emit("resumed", phase=str(state.phase), turns=state.turns, resumes=state.resumes)
            return
        if state.answered_at is not None:
            # A person answered since the last run (the answer moved the phase on so a
            # worker can claim it): acting on it is not a restart either. The flag is
            # cleared and saved now, so a crash after this open counts as one.
            state.answered_at = None
            await self.save("answer_taken")
            self.emit("resumed", phase=str(state.phase), turns=state.turns, resumes=state.resumes)
            return
        last_stop = _last_stop(state)
        lost = state.model_call
        if lost is not None:
            state.unsaved_dollars += lost.worst_dollars
            state.unsaved_replies += 1
            state.model_call = None
            log.warning(
                "turn %d's reply was lost before its save; its worst case $%.4f counts",
                lost.turn,
                lost.worst_dollars,
                extra={"run_id": state.run_id},
            )
        state.resumes += 1
        limit = self.agent.limits.max_resumes
        if state.resumes > limit:
            state.stop_reason = "max-resumes"
            await self.save("resume")
            raise MaxResumes(
                run_id=state.run_id, resumes=state.resumes, limit=limit, last_stop=last_stop
            )
        state.stop_reason = None
        await self.save("resume")
        self.emit("resumed", phase=str(state.phase), turns=state.turns, resumes=state.resumes)

    async def apply_decisions(self, decisions: Decisions) -> None:
        """Record answers a person gave while the run was paused."""
        state = self.state
        changed = False
        for call_id, answer in decisions.items():
            problem = _answer_problem(answer, (Yes, No, Rerun, Done))
            if problem:
                raise InvalidValue(
                    source=f"run {state.run_id!r}: the decision for call {call_id!r}",
                    reason=problem,
                    remedy="nothing was saved; pass Yes(), No(reason), Rerun() or Done(result)",
                )
        open_calls = self.open_calls()
        for call_id, answer in decisions.items():
            pending = state.pending.get(call_id)
            call = open_calls.get(call_id)
            if call is None:
                raise ValueError(f"run {state.run_id!r} has no unanswered call {call_id!r}")
            # An answer must fit its question: Yes/No approve a call that has not run;
            # Rerun/Done settle a call that may have acted (it has a marker).
            in_doubt = call_id in state.markers
            if isinstance(answer, Yes | No) == in_doubt:
                wanted = "Rerun() or Done(result)" if in_doubt else "Yes() or No(reason)"
                raise ValueError(
                    f"run {state.run_id!r}: call {call_id!r} "
                    f"{'may have acted' if in_doubt else 'waits for approval'}; answer it "
                    f"with {wanted}, not {answer!r}"
                )
            now = self.agent.clock()
            if isinstance(answer, Yes | No):
                given = Decision(
                    approved=isinstance(answer, Yes),
                    reason=answer.reason if isinstance(answer, No) else None,
                    decided_at=now,
                )
                state.decisions[call_id] = state.approvals_given[call_id] = given
            elif isinstance(answer, Rerun):
                state.resolutions[call_id] = Resolution(
                    step=3, outcome=ResolutionOutcome.RERUN, detail="decided"
                )
                state.markers.pop(call_id, None)
            elif isinstance(answer, Done):
                state.resolutions[call_id] = Resolution(
                    step=3, outcome=ResolutionOutcome.DONE, detail="decided"
                )
                self._record_result(call, answer.result, is_error=False)
            if pending is not None:
                state.pending.pop(call_id, None)
            changed = True
        if changed:
            if state.phase is Phase.PAUSED and not state.pending:
                state.phase = Phase.TOOLS if self.open_calls() else Phase.MODEL
            await self.save("decisions")

    # -- the loop ----------------------------------------------------------------------

    async def drive(self) -> Outcome:
        state = self.state
        while True:
            if state.phase is Phase.DONE:
                self.emit("done", answer=state.answer, turns=state.turns, dollars=state.dollars)
                return Outcome.from_state(state)
            if state.phase is Phase.MODEL:
                await self.model_turn()
                continue
            for call in list(self.open_calls().values()):
                if not await self.settle(call):
                    self.emit("paused", pending=list(state.pending))
                    return Outcome.from_state(state)
            if state.phase in (Phase.TOOLS, Phase.PAUSED):
                # Every call was already answered (a crash after the last result save).
                state.phase = Phase.MODEL
                await self.save("result")

    async def model_turn(self) -> None:
        state, agent = self.state, self.agent
        if agent.context_policy is not None and agent.context_policy.apply(state):
            await self.save("context")  # a policy first given on resume folds history now
        turn = state.turns + 1
        request = ModelRequest(
            run_id=state.run_id,
            turn=turn,
            system=agent.system,
            messages=tuple(state.messages),
            tools=[
                ToolSpec(name=t.name, description=t.description, schema=t.schema)
                for t in agent.tools.values()
            ],
            summary=state.summary,
            on_delta=lambda delta: self.stream(turn, delta),
        )
        worst = worst_case(agent.model, request)
        await self.check_limits(worst)
        # The provider bills a call whether or not its reply is saved: say so first, so a
        # reply lost before its save is still counted (at its worst case) on resume.
        state.model_call = ModelCall(
            turn=turn,
            model=agent.model.name,
            asked_at=agent.clock(),
            messages=len(state.messages),
            worst_dollars=worst.dollars,
            worst_usage=worst.usage,
        )
        await self.save("model_call")
        reply = checked_reply(await agent.model.reply(request), model=agent.model.name, turn=turn)
        faults.point("loop.reply_received")
        calls = tuple(ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in reply.calls)
        self._check_call_ids(calls)
        dollars = priced(agent.model, reply.usage)
        if worst.bounded and dollars > worst.dollars * (1 + 1e-9):
            log.warning(
                "turn %d cost $%.6f, more than its bound $%.6f: the model's usage bound is wrong",
                turn,
                dollars,
                worst.dollars,
                extra={"run_id": state.run_id},
            )
        state.model_call = None
        self._open = {c.id: c for c in calls}
        state.messages.append(
            AssistantMessage(
                text=reply.text,
                calls=calls,
                usage=reply.usage,
                dollars=dollars,
                model=reply.model,
                turn=turn,
            )
        )
        state.turns = turn
        state.usage = state.usage + reply.usage
        state.dollars += dollars
        if calls:
            state.phase = Phase.TOOLS
        else:
            state.phase = Phase.DONE
            state.answer = reply.text or ""
            state.stop_reason = "answered"
        await self.save("reply")  # save point 2 (and 5 when the reply is the answer)
        self.emit(
            "reply",
            turn=turn,
            text=reply.text,
            calls=[(c.id, c.name) for c in calls],
            dollars=dollars,
        )

    def _check_call_ids(self, calls: Sequence[ToolCall]) -> None:
        seen = {
            c.id for m in self.state.messages if isinstance(m, AssistantMessage) for c in m.calls
        }
        for call in calls:
            if not call.id or call.id in seen:
                # The idempotency key derives from the call ID: a reused ID would make
                # the service treat a new call as a repeat of an old one.
                raise ModelError(
                    provider=self.agent.model.name,
                    reason=f"the reply reuses call ID {call.id!r} (or has none)",
                    remedy="use a model adapter that returns unique call IDs",
                )
            seen.add(call.id)

    async def check_limits(self, worst: WorstCase) -> None:
        """Stop, saved, before a model call that a limit does not allow.

        The dollar budget is hard: the call is refused when its worst case could
        take the run's spend (saved replies plus lost ones at their worst case)
        past ``max_dollars``.
        """
        state, limits = self.state, self.agent.limits
        exceeded: LimitExceeded | None = None
        if limits.max_turns is not None and state.turns >= limits.max_turns:
            exceeded = TurnLimit(run_id=state.run_id, used=state.turns, limit=limits.max_turns)
        elif limits.max_tokens is not None and state.usage.total_tokens >= limits.max_tokens:
            exceeded = TokenLimit(
                run_id=state.run_id, used=state.usage.total_tokens, limit=limits.max_tokens
            )
        elif limits.max_dollars is not None and state.spent >= limits.max_dollars:
            exceeded = DollarLimit(run_id=state.run_id, used=state.spent, limit=limits.max_dollars)
        elif limits.max_dollars is not None and state.spent + worst.dollars > limits.max_dollars:
            exceeded = DollarLimit(
                run_id=state.run_id,
                used=state.spent,
                limit=limits.max_dollars,
                next_call=worst.dollars,
            )
        if limits.max_dollars is not None and not worst.bounded and not self._warned_unbounded:
            self._warned_unbounded = True
            log.warning(
                "model %s declares no max_output_tokens: the dollar budget counts each call's "
                "input but cannot bound its output",
                self.agent.model.name,
                extra={"run_id": state.run_id},
            )
        if exceeded is not None:
            state.stop_reason = f"{exceeded.kind}-limit"
            await self.save("limit")
            raise exceeded

    # -- one call ----------------------------------------------------------------------

    async def settle(self, call: ToolCall) -> bool:
        """Answer one call of the saved reply; False when the run must pause."""
        state, agent = self.state, self.agent
        tool = agent.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(agent.tools)) or "none"
            await self.finish(call, f"unknown tool {call.name!r}; available tools: {known}", True)
            return True
        try:
            arguments = tool.parse(call.arguments)
        except ToolInputError as exc:
            await self.finish(call, str(exc), True)
            return True

        marker = state.markers.get(call.id)
        if marker is not None:
            return await self.resolve_in_doubt(call, tool, marker, arguments)

        if tool.needs_approval:
            decision = state.decisions.get(call.id)
            if decision is None:
                answer = await self.ask_approval(call, tool)
                if answer is None:
                    return False
                decision = answer
            if not decision.approved:
                await self.finish(call, f"refused by the approver: {decision.reason}", True)
                return True
        return await self.execute(call, tool, arguments, previous=None)

    async def ask_approval(self, call: ToolCall, tool: Tool) -> Decision | None:
        state = self.state
        if call.id not in state.pending:
            state.pending[call.id] = Approval(
                call_id=call.id,
                tool=tool.name,
                arguments=call.arguments,
                asked_at=self.agent.clock(),
            )
            state.phase = Phase.PAUSED
            await self.save("pause")  # save point 5: waiting for a person
        self.emit("approval", call_id=call.id, tool=tool.name)
        try:
            answer = await self.agent.approver.approve(
                ApprovalRequest(
                    run_id=state.run_id,
                    call_id=call.id,
                    tool=tool.name,
                    arguments=call.arguments,
                    effect=str(tool.effect),
                )
            )
        except ApprovalUnavailable as exc:
            # The question is saved (the pause above): the run waits for a person.
            self.emit("unavailable", call_id=call.id, tool=tool.name, reason=exc.reason)
            return None
        if answer is DEFER:
            return None
        problem = _answer_problem(answer, (Yes, No))
        if problem or not isinstance(answer, Yes | No):
            raise InvalidValue(
                source=f"approver.approve for call {call.id!r} of tool {tool.name!r}",
                reason=problem or "",
                remedy="answer Yes(), No(reason) or DEFER; the run is saved as paused and "
                "asks again when resumed",
            )
        decision = Decision(
            approved=isinstance(answer, Yes),
            reason=answer.reason if isinstance(answer, No) else None,
            decided_at=self.agent.clock(),
            by=_approver_name(self.agent.approver),
        )
        # Kept in memory only: it is saved with the attempt marker (yes) or the result (no),
        # so a crash in between asks again and leaves nothing to resolve.
        state.decisions[call.id] = state.approvals_given[call.id] = decision
        state.pending.pop(call.id, None)
        state.phase = Phase.TOOLS
        self.emit("approved" if decision.approved else "refused", call_id=call.id, tool=tool.name)
        return decision

    async def resolve_in_doubt(
        self, call: ToolCall, tool: Tool, marker: AttemptMarker, arguments: dict[str, Any]
    ) -> bool:
        state = self.state

        async def before_asking(why: str) -> None:
            # Save point 5, as for approvals: the call now waits for a person, so a crash or
            # an unreachable approver leaves the run paused with the question on disk.
            if call.id not in state.pending:
                state.pending[call.id] = Approval(
                    call_id=call.id,
                    tool=tool.name,
                    arguments=call.arguments,
                    asked_at=self.agent.clock(),
                    kind=ApprovalKind.RESOLVE,
                    why=why,
                )
                state.phase = Phase.PAUSED
                await self.save("pause")

        verdict = await ladder.climb(
            call=call,
            tool=tool,
            marker=marker,
            ctx=self.context(call, marker.intended),
            approver=self.agent.approver,
            arguments=arguments,
            before_asking=before_asking,
        )
        if verdict.unavailable is not None:
            self.emit("unavailable", call_id=call.id, tool=tool.name, reason=verdict.unavailable)
        self.emit(
            "ladder", call_id=call.id, tool=tool.name, step=verdict.step, outcome=verdict.outcome
        )
        if verdict.outcome == "deferred":
            return False  # the question was saved by before_asking
        state.pending.pop(call.id, None)
        if state.phase is Phase.PAUSED and not state.pending:
            state.phase = Phase.TOOLS
        state.resolutions[call.id] = Resolution(
            step=verdict.step,
            outcome=ResolutionOutcome(verdict.outcome),
            detail=verdict.detail,
            by=_approver_name(self.agent.approver) if verdict.step == 3 else None,
        )
        if verdict.result is not None:
            await self.finish(call, verdict.result, False)
            return True
        return await self.execute(call, tool, arguments, previous=marker)

    async def execute(
        self,
        call: ToolCall,
        tool: Tool,
        arguments: dict[str, Any],
        *,
        previous: AttemptMarker | None,
    ) -> bool:
        """Run one call (marker first, unless it only reads); False when the run must pause."""
        state = self.state
        intended: dict[str, str] = {}
        if tool.effect is not Effect.READ:
            if previous is not None:
                # Keep the first attempt's time (the service's key age counts from it)
                # and its intended hashes (the file may already hold them).
                marker = previous
            else:
                try:
                    files = await tool.intended_files(self.context(call), **arguments)
                except ToolInDoubt as exc:
                    # Nothing was sent yet (no marker is saved): an ordinary failure.
                    await self.finish(call, _error_text(exc), True)
                    return True
                except Exception as exc:  # user code: the model sees it, as for the tool
                    await self.finish(call, _error_text(exc), True)
                    return True
                intended = {path: sha256_bytes(data) for path, data in files.items()}
                marker = AttemptMarker(
                    key=idempotency_key(state.run_id, call.id),
                    tool=tool.name,
                    started_at=self.agent.clock(),
                    intended=intended,
                )
            state.markers[call.id] = marker
            intended = dict(marker.intended)
            await self.save("attempt")  # save point 3
        if self.agent.workspace is not None:
            self.agent.workspace.take_written()
        self.emit("call", call_id=call.id, tool=tool.name, effect=str(tool.effect))
        try:
            content = await tool(self.context(call, intended), **arguments)
            is_error = False
        except ToolInDoubt as exc:
            if tool.effect is Effect.READ or previous is not None:
                # Already a second try in this process (or nothing to fear): report it.
                content, is_error = _error_text(exc), True
            else:
                self.emit("in-doubt", call_id=call.id, tool=tool.name, reason=_error_text(exc))
                return await self.resolve_in_doubt(call, tool, state.markers[call.id], arguments)
        except KeyNotSent:
            raise  # strict (warnings are errors): the run stops, unsaved, and the test fails
        except Exception as exc:  # the model sees what went wrong, as the call's result
            content, is_error = _error_text(exc), True
            if isinstance(exc, ToolResultError):
                log.error("%s", content, extra={"run_id": state.run_id, "call_id": call.id})
        faults.point(f"loop.tool_returned:{tool.name}")
        await self.finish(call, content, is_error)
        return True

    async def finish(self, call: ToolCall, content: str, is_error: bool) -> None:
        """Save point 4: the call's result, with its marker cleared."""
        self._record_result(call, content, is_error=is_error)
        await self.save("result")
        self.emit("result", call_id=call.id, tool=call.name, is_error=is_error, content=content)

    def open_calls(self) -> dict[str, ToolCall]:
        """The newest reply's calls without a result, by ID; kept up to date as results land.

        Derived from the state once per process and then maintained, so a reply with
        thousands of calls costs linear time, not a walk of the history per call.
        """
        if self._open is None:
            self._open = {c.id: c for c in self.state.unanswered()}
        return self._open

    def _record_result(self, call: ToolCall, content: str, *, is_error: bool) -> None:
        state = self.state
        state.messages.append(
            ToolResult(call_id=call.id, name=call.name, content=content, is_error=is_error)
        )
        open_calls = self.open_calls()
        open_calls.pop(call.id, None)
        state.markers.pop(call.id, None)
        state.pending.pop(call.id, None)
        if self.agent.workspace is not None:
            state.workspace.update(self.agent.workspace.take_written())
        if not open_calls:
            state.phase = Phase.MODEL
            state.decisions.clear()
            if self.agent.context_policy is not None:
                self.agent.context_policy.apply(state)
        elif state.phase is Phase.PAUSED and not state.pending:
            state.phase = Phase.TOOLS


def _approver_name(approver: object) -> str:
    """How an approver is named where its answers are recorded.

    Its ``name`` attribute when it has a non-empty string one, else its class name
    (``TerminalApprover``).
    """
    name = getattr(approver, "name", None)
    if isinstance(name, str) and name.strip():
        return name
    return type(approver).__name__


def _error_text(exc: BaseException) -> str:
    """An exception as the model sees it in an error result, always storable."""
    return exception_text(exc)


def _answer_problem(answer: object, allowed: tuple[type, ...]) -> str | None:
    """Why an approver's answer cannot be taken, or None when it can."""
    if not isinstance(answer, allowed):
        names = " or ".join(f"{t.__name__}()" for t in allowed)
        return f"expected {names}, got {describe(answer)}"
    # The dataclasses check their text when built; an object changed since is checked here.
    text = answer.reason if isinstance(answer, No) else getattr(answer, "result", None)
    if isinstance(answer, No | Done):
        return text_problem(text)
    return None


def _last_stop(state: RunState) -> str:
    """Where the run's last save left it, in words, for ``MaxResumes``."""
    words = f"phase {state.phase} at turn {state.turns}"
    if state.markers:
        words += f", call(s) {', '.join(sorted(state.markers))} in doubt"
    if state.model_call is not None:
        words += f", waiting for the model's reply to turn {state.model_call.turn}"
    if state.stop_reason:
        words += f", stopped by {state.stop_reason}"
    return words
