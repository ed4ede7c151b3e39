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

(:class:`durably.engine.SavePoint` names them.)

A restart never asks again for a saved reply, runs only the saved reply's
unanswered calls, and sends every call that has a marker to the ladder instead
of running it blindly. Every save is shielded: a cancellation waits for the save
in flight and then propagates.

The saves, markers, keys, ladder, limits and restart counting are the engine's
(:mod:`durably.engine`), shared with the framework adapters; this module is the
part that is about durably's own model seam: building each model request,
pricing its worst case, and taking the reply.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from . import _declarations, faults
from ._values import text_problem
from .approval import Approver, ScriptedApprover
from .engine import OUTCOME_SOURCES as OUTCOME_SOURCES  # held in step with Outcome by a test
from .engine import Decisions as Decisions
from .engine import (
    Event,
    EventKind,
    Limits,
    Outcome,
    RunSession,
    Save,
    SavePoint,
    shielded,
)
from .errors import InvalidValue, RunCancelled
from .keys import new_run_id, validate_run_id
from .models import Delta, Model, ModelRequest, ToolSpec, checked_reply, priced, worst_case
from .state import (
    AssistantMessage,
    Fingerprint,
    Message,
    Phase,
    RunState,
    ToolCall,
    ToolPrint,
    ToolResult,
    UserMessage,
    utcnow,
)
from .stores import RunHandle, Store
from .tools import Tool, ToolInputError
from .workspace import Workspace

__all__ = ["Agent", "ContextPolicy", "Event", "EventKind", "Limits", "Outcome", "shielded"]
log = logging.getLogger("durably.loop")


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

    def __init__(  # noqa: PLR0913 - the public Agent's options, keyword-only with defaults
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
        handle = await self._the_store().create(state)  # SavePoint.START
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
        await shielded(handle.save(state))  # SavePoint.START
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
        if state.phase is Phase.CANCELLED:
            raise RunCancelled(run_id=state.run_id)  # never carried on, never started afresh
        driver = _Driver(self, handle, state)
        state.max_dollars = self.limits.max_dollars  # for people; saved with the next save
        session = driver.session
        try:
            await session.count_restart()
            session.check_agent(self.fingerprint(), allow_change=self.allow_agent_change)
            session.check_workspace()
            await session.apply_decisions(decisions or {})
        except RunCancelled:
            return Outcome.from_state(state)  # asked to stop while no owner held it
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
            max_dollars=self.limits.max_dollars,
        )

    async def _drive_new(self, handle: RunHandle, state: RunState) -> Outcome:
        """Drive a run whose first state was just saved (save point 1)."""
        faults.point(SavePoint.START.crash_point)
        driver = _Driver(self, handle, state)
        driver.session.emit("started", task=state.task)
        return await driver.drive()


class _Driver:
    """durably's own front end on the engine: the model seam, and phase by phase."""

    def __init__(self, agent: Agent, handle: RunHandle, state: RunState) -> None:
        self.agent = agent
        self.state = state
        self.session = RunSession(
            handle,
            state,
            limits=agent.limits,
            approver=agent.approver,
            clock=agent.clock,
            workspace=agent.workspace,
            observer=agent.observer,
            history=agent.context_policy,
        )

    def stream(self, turn: int, delta: Delta) -> None:
        # To the observer only: a log line per streamed piece would drown the log.
        self.session.observe(delta.kind, {"turn": turn, **delta.data()})

    async def drive(self) -> Outcome:
        """Run phase by phase until the run is done, paused or cancelled (``durably cancel``)."""
        try:
            return await self._phases()
        except RunCancelled:
            return Outcome.from_state(self.state)  # saved as cancelled by the session

    async def _phases(self) -> Outcome:
        state, session = self.state, self.session
        while True:
            if state.phase is Phase.DONE:
                session.emit("done", answer=state.answer, turns=state.turns, dollars=state.dollars)
                return Outcome.from_state(state)
            if state.phase is Phase.MODEL:
                await self.model_turn()
                continue
            for call in list(session.open_calls().values()):
                if not await self.settle(call):
                    session.emit("paused", pending=list(state.pending))
                    return Outcome.from_state(state)
            if state.phase in (Phase.TOOLS, Phase.PAUSED):
                # Every call was already answered (a crash after the last result save).
                state.phase = Phase.MODEL
                await session.save(SavePoint.RESULT)

    async def model_turn(self) -> None:
        state, agent, session = self.state, self.agent, self.session
        if agent.context_policy is not None and agent.context_policy.apply(state):
            await session.save(Save.CONTEXT)  # a policy first given on resume folds history now
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
        await session.check_limits(worst, model=agent.model.name)
        await session.mark_model_call(turn=turn, model=agent.model.name, worst=worst)
        reply = checked_reply(await agent.model.reply(request), model=agent.model.name, turn=turn)
        faults.point("loop.reply_received")
        calls = tuple(ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in reply.calls)
        session.check_call_ids(calls, model=agent.model.name)
        dollars = priced(agent.model, reply.usage)
        if worst.bounded and dollars > worst.dollars * (1 + 1e-9):
            log.warning(
                "turn %d cost $%.6f, more than its bound $%.6f: the model's usage bound is wrong",
                turn,
                dollars,
                worst.dollars,
                extra={"run_id": state.run_id},
            )
        await session.save_reply(
            turn=turn,
            text=reply.text,
            calls=calls,
            usage=reply.usage,
            dollars=dollars,
            model=reply.model,
        )

    async def settle(self, call: ToolCall) -> bool:
        """Answer one call of the saved reply by its tool's name; False when the run must pause."""
        tools = self.agent.tools
        tool = tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(tools)) or "none"
            message = f"unknown tool {call.name!r}; available tools: {known}"
            await self.session.finish(call, message, True)
            return True
        try:
            arguments = tool.parse(call.arguments)
        except ToolInputError as exc:
            await self.session.finish(call, str(exc), True)
            return True
        return await self.session.settle(call, tool, arguments)
