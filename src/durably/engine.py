"""The exactly-once engine every front end drives: save points, markers, keys, the ladder.

A :class:`RunSession` is one process's hold on one run. It holds what is not
about any model or framework (docs/concepts.md, "Save points"): the model-call
marker and the reply save, the attempt marker with the derived key, the result
save, the ladder, the person's question, limits and restart counting, and the
agent's fingerprint. durably's own :class:`~durably.Agent` drives it, and so
does each framework adapter (``durably.pydantic_ai``): the adapter maps its
framework's hooks onto :meth:`RunSession.mark_model_call`,
:meth:`RunSession.save_reply`, :meth:`RunSession.settle` and the rest, and owns
nothing else.

The save points are a type, :class:`SavePoint`; the other saves the engine makes
(the model-call marker, the restart count, a limit reached) are :class:`Save`.
Each one's crash-point label (``loop.saved.<value>``) derives from it.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, TypeVar

from . import _declarations, _tracing, faults, ladder
from ._values import describe, exception_text, text_problem
from .approval import DEFER, ApprovalRequest, Approver, Done, No, Rerun, Yes
from .errors import (
    AgentChanged,
    ApprovalUnavailable,
    DollarLimit,
    InvalidValue,
    LimitExceeded,
    MaxResumes,
    ModelError,
    RunCancelled,
    TokenLimit,
    TurnLimit,
)
from .keys import idempotency_key
from .models import WorstCase
from .state import (
    Approval,
    ApprovalKind,
    AssistantMessage,
    AttemptMarker,
    Decision,
    Effect,
    Fingerprint,
    ModelCall,
    Phase,
    Resolution,
    ResolutionOutcome,
    RunState,
    ToolCall,
    ToolResult,
    Usage,
)
from .stores import RunHandle
from .tools import KeyNotSent, Tool, ToolContext, ToolInDoubt, ToolResultError
from .workspace import Workspace, sha256_bytes

__all__ = [
    "CRASH_POINT_PREFIX",
    "OUTCOME_SOURCES",
    "Decisions",
    "Event",
    "EventKind",
    "HistoryPolicy",
    "Limits",
    "Outcome",
    "RunSession",
    "Save",
    "SavePoint",
    "differences",
    "shielded",
]

log = logging.getLogger("durably.loop")  # the engine's lines keep the loop's logger name
_T = TypeVar("_T")

CRASH_POINT_PREFIX = "loop.saved."
"""Every save's crash point is this prefix and the save's value (kept from the loop's labels,
so the sweep's reference tables still name the same points)."""


class SavePoint(enum.StrEnum):
    """The five save points, in order (SPEC: "The loop and its save points").

    The values are the crash-point labels' stable tails (``loop.saved.reply``).
    """

    START = "start"
    """A new run is saved (phase ``model``) before the first model call."""
    REPLY = "reply"
    """A reply with its call IDs and usage, before any of its calls runs (``done``
    when it has no calls)."""
    ATTEMPT = "attempt"
    """An attempt marker, just before each call whose effect is not ``read``."""
    RESULT = "result"
    """A call's result, with its marker cleared."""
    PAUSE = "pause"
    """A call waiting for a person (the answer itself is saved by :attr:`REPLY`)."""

    @property
    def heading(self) -> str:
        """How the docs name this point in their numbered list."""
        return "pause / done" if self is SavePoint.PAUSE else self.value

    @property
    def crash_point(self) -> str:
        """The label of the crash point just after this save returns."""
        return CRASH_POINT_PREFIX + self.value


class Save(enum.StrEnum):
    """The engine's other saves: none is a moment of the five, each keeps a count honest."""

    MODEL_CALL = "model_call"
    """Before each model call: the call is about to be paid for (a lost reply still counts)."""
    RESTART = "resume"
    """The restart count, saved before anything else on every open that is a restart."""
    ANSWER_TAKEN = "answer_taken"
    """A person's saved answer was taken up; a crash after this counts as a restart."""
    DECISIONS = "decisions"
    """Answers given with ``resume(decisions=...)``."""
    CONTEXT = "context"
    """History folded into a summary before a model call."""
    LIMIT = "limit"
    """A limit stopped the run."""
    CANCELLED = "cancelled"
    """``durably cancel`` stopped the run: saved after a save with no call in flight."""

    @property
    def crash_point(self) -> str:
        """The label of the crash point just after this save returns."""
        return CRASH_POINT_PREFIX + self.value


class HistoryPolicy(Protocol):
    """Folds old history into a summary (``durably.ContextPolicy``)."""

    def apply(self, state: RunState) -> bool:
        """Fold old messages into the summary if needed; True when the state changed."""
        ...


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
    "cancelled",
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
    - ``cancelled`` (``turns``, ``dollars``): ``durably cancel`` stopped the run, saved
      as ``cancelled``;
    - from a streaming model, before its ``reply``: ``text-delta`` (``turn``, ``text``)
      and ``arguments-delta`` (``turn``, ``call_id``, ``tool``, ``text``), sent to the
      observer only, never logged.
    """

    kind: EventKind
    """One of :data:`EventKind`."""
    run_id: str
    data: Mapping[str, Any] = field(default_factory=dict)


OutcomeStatus = Literal["done", "paused", "cancelled"]

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
        status: OutcomeStatus = "paused"
        if state.phase is Phase.DONE:
            status = "done"
        elif state.phase is Phase.CANCELLED:
            status = "cancelled"
        return cls(
            run_id=state.run_id,
            status=status,
            answer=state.answer,
            stop_reason=state.stop_reason,
            turns=state.turns,
            dollars=state.dollars,
            pending=tuple(state.pending.values()),
            state=state,
        )


Decisions = Mapping[str, Yes | No | Rerun | Done]


def differences(saved: Fingerprint, now: Fingerprint) -> list[str]:
    """How the agent ``now`` differs from the one a run was ``saved`` with, in words."""
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


class RunSession:
    """One process's hold on one run: every save, marker, key and ladder step of it.

    A front end opens a session on a run's handle and its loaded state, then
    drives it: :meth:`count_restart` (and :meth:`check_agent`,
    :meth:`check_workspace`) on every open for resume; :meth:`check_limits` and
    :meth:`mark_model_call` before each model call; :meth:`save_reply` when the
    reply arrives; :meth:`settle` for each of the reply's :meth:`open_calls`. A
    call's tool runs through the ``run`` callable given to :meth:`settle`, so a
    framework that runs tools itself hands its own handler in.

    Args:
        handle: owns the run; every save goes through it.
        state: the run's state as last saved (or as just created).
        limits: turn, token, dollar and resume limits over the run's life.
        approver: answers approval and in-doubt questions.
        clock: the time source for markers and key ages.
        workspace: the directory tools write files through, if any.
        observer: called with every :class:`Event`.
        history: folds old history into a summary as results land.
    """

    def __init__(
        self,
        handle: RunHandle,
        state: RunState,
        *,
        limits: Limits,
        approver: Approver,
        clock: Callable[[], datetime],
        workspace: Workspace | None = None,
        observer: Callable[[Event], None] | None = None,
        history: HistoryPolicy | None = None,
    ) -> None:
        if state.run_id != handle.run_id:
            raise ValueError(f"the state of run {state.run_id!r} given with run {handle.run_id!r}")
        self.handle = handle
        self.state = state
        self.limits = limits
        self.approver = approver
        self.clock = clock
        self.workspace = workspace
        self.observer = observer
        self.history = history
        self._open: dict[str, ToolCall] | None = None
        """The newest reply's unanswered calls (see :meth:`open_calls`)."""
        self._warned_unbounded = False
        self._saving: Any = None
        """An asyncio lock once two tasks save at once (a framework's parallel calls)."""
        self._asks_cancel: Callable[[], bool] | None = getattr(handle, "cancel_requested", None)
        """The handle's ``cancel_requested`` (a store with ``Housekeeping``), else None."""
        self.cancelled = False
        """True once this session saved the run as ``cancelled``: it saves nothing more."""
        self.trace = _tracing.for_run(state.run_id, owner=self, state=state)
        """OpenTelemetry spans of this session (no-op hooks unless the application traces)."""

    # -- plumbing --------------------------------------------------------------------

    async def save(self, point: SavePoint | Save) -> None:
        """Save the state through the handle, shielded, then pass ``point``'s crash point.

        After a save with no call in flight (not an attempt marker's, and no marker
        left: a marked call finishes its ladder story first), a run that
        ``durably cancel`` asked to stop is saved as ``cancelled`` and
        :class:`~durably.RunCancelled` is raised: nothing after this save runs.

        Raises:
            RunCancelled: the run is cancelled (now, or by an earlier save of this
                session: nothing is saved over a cancelled run).
        """
        if self.cancelled:
            raise RunCancelled(run_id=self.state.run_id)
        await self._write()
        faults.point(point.crash_point)
        if point is not SavePoint.ATTEMPT and self._cancel_asked():
            if point is Save.MODEL_CALL:
                self.state.model_call = None  # the model is never asked: nothing to pay
            self.state.cancel()
            self.cancelled = True
            await self._write()
            faults.point(Save.CANCELLED.crash_point)
            self.emit("cancelled", turns=self.state.turns, dollars=self.state.dollars)
            raise RunCancelled(run_id=self.state.run_id)

    def _cancel_asked(self) -> bool:
        """Whether the run may stop here and ``durably cancel`` asked it to."""
        state = self.state
        if self._asks_cancel is None or state.markers or state.phase.finished:
            return False
        return self._asks_cancel()

    async def _write(self) -> None:
        """The save itself: at once when the store waits for nothing, else awaited, shielded."""
        # A save with nothing to wait for (a store that does not sync) is made at once: a
        # call no cancellation can interrupt, so it needs no task and no shield.
        at_once = getattr(self.handle, "save_without_waiting", None)
        if at_once is None or not at_once(self.state):
            if self._saving is None:
                import asyncio  # imported where it runs: `import durably` stays light

                self._saving = asyncio.Lock()
            # Calls run in parallel (a framework's tool tasks) share one handle: one save at a
            # time, each of the whole state as it stands when its turn comes.
            async with self._saving:
                await shielded(self.handle.save(self.state))

    def emit(self, kind: EventKind, **data: Any) -> None:
        """Log ``kind`` and tell the observer; a failing observer never stops the run."""
        ladder.announce(kind, self.state.run_id, data)  # verdicts and approvals, one line each
        call_id = data.get("call_id")
        log.info(
            "%s %s",
            kind,
            data,
            extra={"run_id": self.state.run_id, "phase": str(self.state.phase), "call_id": call_id},
        )
        self.trace.event(kind, data, state=self.state)
        self.observe(kind, data)

    def observe(self, kind: EventKind, data: Mapping[str, Any]) -> None:
        """Tell the observer only (streamed pieces: a log line each would drown the log)."""
        if self.observer is not None:
            try:
                self.observer(Event(kind=kind, run_id=self.state.run_id, data=data))
            except Exception:
                # The observer only watches: a failing display must not stop the run.
                log.exception("observer raised on %s; the run goes on", kind)

    # -- on open -----------------------------------------------------------------------

    def check_agent(self, now: Fingerprint, *, allow_change: bool = False) -> None:
        """Stop with ``AgentChanged`` when ``now`` is not the agent the run was started with."""
        saved = self.state.fingerprint
        if saved is None or allow_change:
            return
        found = differences(saved, now)
        if found:
            raise AgentChanged(run_id=self.state.run_id, differences=found)

    def check_workspace(self) -> None:
        """Stop with ``WorkspaceChanged`` when a recorded file no longer matches."""
        state = self.state
        if self.workspace is None or not state.workspace:
            return
        accepted: dict[str, set[str]] = {}
        for marker in state.markers.values():  # an in-doubt write may or may not have landed
            for path, digest in marker.intended.items():
                accepted.setdefault(path, set()).add(digest)
        self.workspace.verify(state.workspace, run_id=state.run_id, also_accept=accepted)

    # -- the model's side ----------------------------------------------------------------

    async def mark_model_call(self, *, turn: int, model: str, worst: WorstCase) -> None:
        """Save the model-call marker: the call about to be paid for, at its worst case."""
        # The provider bills a call whether or not its reply is saved: say so first, so a
        # reply lost before its save is still counted (at its worst case) on resume.
        self.state.model_call = ModelCall(
            turn=turn,
            model=model,
            asked_at=self.clock(),
            messages=len(self.state.messages),
            worst_dollars=worst.dollars,
            worst_usage=worst.usage,
        )
        await self.save(Save.MODEL_CALL)
        self.trace.model_call(turn=turn, model=model)

    def check_call_ids(self, calls: Iterable[ToolCall], *, model: str) -> None:
        """Refuse a reply whose call IDs are empty or already used in this run."""
        seen = {
            c.id for m in self.state.messages if isinstance(m, AssistantMessage) for c in m.calls
        }
        for call in calls:
            if not call.id or call.id in seen:
                # The idempotency key derives from the call ID: a reused ID would make
                # the service treat a new call as a repeat of an old one.
                raise ModelError(
                    provider=model,
                    reason=f"the reply reuses call ID {call.id!r} (or has none)",
                    remedy="use a model adapter that returns unique call IDs",
                )
            seen.add(call.id)

    async def save_reply(
        self,
        *,
        turn: int,
        text: str | None,
        calls: Sequence[ToolCall],
        usage: Usage,
        dollars: float,
        model: str | None,
    ) -> None:
        """Save point 2 (and 5 when the reply has no calls: it is the answer).

        Clears the model-call marker and records the reply with its calls, usage and
        price; from here a restart runs only this reply's calls.
        """
        state = self.state
        state.model_call = None
        self._open = {c.id: c for c in calls}
        state.messages.append(
            AssistantMessage(
                text=text,
                calls=tuple(calls),
                usage=usage,
                dollars=dollars,
                model=model,
                turn=turn,
            )
        )
        state.turns = turn
        state.usage = state.usage + usage
        state.dollars += dollars
        if calls:
            state.phase = Phase.TOOLS
        else:
            state.phase = Phase.DONE
            state.answer = text or ""
            state.stop_reason = "answered"
        await self.save(SavePoint.REPLY)
        self.trace.reply(usage=usage, dollars=dollars, model=model, calls=len(calls))
        self.emit(
            "reply",
            turn=turn,
            text=text,
            calls=[(c.id, c.name) for c in calls],
            dollars=dollars,
        )

    # -- one call ------------------------------------------------------------------------

    async def settle(
        self,
        call: ToolCall,
        tool: Tool,
        arguments: dict[str, Any],
        *,
        run: Callable[[ToolContext], Awaitable[str]] | None = None,
    ) -> bool:
        """Answer one call of the saved reply; False when the run must pause.

        A call with a marker goes up the ladder; a call needing approval asks
        first; anything else runs (marker first unless it only reads) through
        ``run`` (default: the tool itself with ``arguments``), and its result is saved.
        """
        state = self.state
        marker = state.markers.get(call.id)
        if marker is not None:
            return await self.resolve_in_doubt(call, tool, marker, arguments, run=run)

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
        return await self.execute(call, tool, arguments, previous=None, run=run)

    def context(self, call: ToolCall, intended: Mapping[str, str] | None = None) -> ToolContext:
        """What a tool serving ``call`` is told: the run, the call, its derived key."""
        return ToolContext(
            run_id=self.state.run_id,
            call_id=call.id,
            idempotency_key=idempotency_key(self.state.run_id, call.id),
            workspace=self.workspace,
            clock=self.clock,
            intended=dict(intended or {}),
        )

    # -- resume ----------------------------------------------------------------------

    async def count_restart(self) -> None:
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
            await self.save(Save.ANSWER_TAKEN)
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
        limit = self.limits.max_resumes
        if state.resumes > limit:
            state.stop_reason = "max-resumes"
            await self.save(Save.RESTART)
            raise MaxResumes(
                run_id=state.run_id, resumes=state.resumes, limit=limit, last_stop=last_stop
            )
        state.stop_reason = None
        await self.save(Save.RESTART)
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
            now = self.clock()
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
            await self.save(Save.DECISIONS)

    # -- the loop ----------------------------------------------------------------------

    async def check_limits(self, worst: WorstCase, *, model: str) -> None:
        """Stop, saved, before a model call that a limit does not allow.

        The dollar budget is hard: the call is refused when its worst case could
        take the run's spend (saved replies plus lost ones at their worst case)
        past ``max_dollars``.
        """
        state, limits = self.state, self.limits
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
                model,
                extra={"run_id": state.run_id},
            )
        if exceeded is not None:
            state.stop_reason = f"{exceeded.kind}-limit"
            await self.save(Save.LIMIT)
            raise exceeded

    # -- one call ----------------------------------------------------------------------

    async def ask_approval(self, call: ToolCall, tool: Tool) -> Decision | None:
        """Ask the approver about ``call`` (the question saved first); None to pause."""
        state = self.state
        if call.id not in state.pending:
            state.pending[call.id] = Approval(
                call_id=call.id,
                tool=tool.name,
                arguments=call.arguments,
                asked_at=self.clock(),
            )
            state.phase = Phase.PAUSED
            await self.save(SavePoint.PAUSE)  # save point 5: waiting for a person
        self.emit("approval", call_id=call.id, tool=tool.name)
        try:
            answer = await self.approver.approve(
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
            decided_at=self.clock(),
            by=_approver_name(self.approver),
        )
        # Kept in memory only: it is saved with the attempt marker (yes) or the result (no),
        # so a crash in between asks again and leaves nothing to resolve.
        state.decisions[call.id] = state.approvals_given[call.id] = decision
        state.pending.pop(call.id, None)
        state.phase = Phase.TOOLS
        self.emit("approved" if decision.approved else "refused", call_id=call.id, tool=tool.name)
        return decision

    async def resolve_in_doubt(
        self,
        call: ToolCall,
        tool: Tool,
        marker: AttemptMarker,
        arguments: dict[str, Any],
        *,
        run: Callable[[ToolContext], Awaitable[str]] | None = None,
        said: str | None = None,
    ) -> bool:
        """Settle a call that may have acted through the ladder; False when it must pause.

        ``said``: what the tool's ``ToolInDoubt`` said, when this process heard it.
        """
        verdict = await self.judge_in_doubt(call, tool, marker, arguments, said=said)
        return await self.act_on_verdict(call, tool, marker, arguments, verdict, run=run)

    async def judge_in_doubt(
        self,
        call: ToolCall,
        tool: Tool,
        marker: AttemptMarker,
        arguments: dict[str, Any],
        *,
        said: str | None = None,
    ) -> ladder.Verdict:
        """Climb the ladder for an in-doubt call without acting on the verdict.

        A ``deferred`` verdict has its question saved (save point 5); any other is for
        :meth:`act_on_verdict`, in this process (nothing of it is saved yet). A front end
        whose framework asks "may this call run?" before running it (the Agents SDK's
        ``needs_approval``) judges there and acts when the framework runs the call.
        """
        state = self.state

        async def before_asking(why: str) -> None:
            # Save point 5, as for approvals: the call now waits for a person, so a crash or
            # an unreachable approver leaves the run paused with the question on disk.
            if call.id not in state.pending:
                state.pending[call.id] = Approval(
                    call_id=call.id,
                    tool=tool.name,
                    arguments=call.arguments,
                    asked_at=self.clock(),
                    kind=ApprovalKind.RESOLVE,
                    # The tool's own words (the person's best clue) travel with the question.
                    why=why if said is None else f"{why}; the tool said: {said}",
                )
                state.phase = Phase.PAUSED
                await self.save(SavePoint.PAUSE)

        verdict = await ladder.climb(
            call=call,
            tool=tool,
            marker=marker,
            ctx=self.context(call, marker.intended),
            approver=self.approver,
            arguments=arguments,
            before_asking=before_asking,
        )
        if verdict.unavailable is not None:
            self.emit("unavailable", call_id=call.id, tool=tool.name, reason=verdict.unavailable)
        self.emit(
            "ladder", call_id=call.id, tool=tool.name, step=verdict.step, outcome=verdict.outcome
        )
        return verdict

    async def act_on_verdict(
        self,
        call: ToolCall,
        tool: Tool,
        marker: AttemptMarker,
        arguments: dict[str, Any],
        verdict: ladder.Verdict,
        *,
        run: Callable[[ToolContext], Awaitable[str]] | None = None,
    ) -> bool:
        """Act on :meth:`judge_in_doubt`'s verdict; False when it waits for a person.

        The found result is saved, or the call runs again under its first marker.
        """
        state = self.state
        if verdict.outcome == "deferred":
            return False  # the question was saved by before_asking
        state.pending.pop(call.id, None)
        if state.phase is Phase.PAUSED and not state.pending:
            state.phase = Phase.TOOLS
        state.resolutions[call.id] = Resolution(
            step=verdict.step,
            outcome=ResolutionOutcome(verdict.outcome),
            detail=verdict.detail,
            by=_approver_name(self.approver) if verdict.step == 3 else None,
        )
        if verdict.result is not None:
            await self.finish(call, verdict.result, False)
            return True
        return await self.execute(call, tool, arguments, previous=marker, run=run)

    async def execute(
        self,
        call: ToolCall,
        tool: Tool,
        arguments: dict[str, Any],
        *,
        previous: AttemptMarker | None,
        run: Callable[[ToolContext], Awaitable[str]] | None = None,
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
                    started_at=self.clock(),
                    intended=intended,
                )
            state.markers[call.id] = marker
            intended = dict(marker.intended)
            await self.save(SavePoint.ATTEMPT)  # save point 3
        if self.workspace is not None:
            self.workspace.take_written()
        self.emit("call", call_id=call.id, tool=tool.name, effect=str(tool.effect))
        try:
            ctx = self.context(call, intended)
            with self.trace.tool_call(
                turn=state.turns,
                call_id=call.id,
                tool=tool.name,
                effect=str(tool.effect),
                # Derived here, not read from ctx: reading ctx's key marks it sent, and
                # KeyNotSent must still see a keyed tool that never read it.
                key=(
                    None if tool.effect is Effect.READ else idempotency_key(state.run_id, call.id)
                ),
                marker="none" if tool.effect is Effect.READ else "kept" if previous else "saved",
            ):
                content = await (tool(ctx, **arguments) if run is None else run(ctx))
            is_error = False
        except ToolInDoubt as exc:
            if tool.effect is Effect.READ or previous is not None:
                # Already a second try in this process (or nothing to fear): report it.
                content, is_error = _error_text(exc), True
            else:
                said = _error_text(exc)
                self.emit("in-doubt", call_id=call.id, tool=tool.name, reason=said)
                return await self.resolve_in_doubt(
                    call, tool, state.markers[call.id], arguments, run=run, said=said
                )
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
        await self.save(SavePoint.RESULT)
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
        if self.workspace is not None:
            state.workspace.update(self.workspace.take_written())
        if not open_calls:
            state.phase = Phase.MODEL
            state.decisions.clear()
            if self.history is not None:
                self.history.apply(state)
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
