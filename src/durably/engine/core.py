"""A run session's core: its saves, its checks on open, the model's side and a resume.

:class:`SessionCore` holds one run's handle and state and makes every save;
:class:`~durably.engine.calls.RunSession` adds the side of the tool calls. The
split is by what a front end drives: this half before and around a model call,
that half for each call of a saved reply.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from .. import _tracing, faults, ladder
from ..approval import Approver, Done, No, Rerun, Yes
from ..errors import (
    AgentChanged,
    DollarLimit,
    InvalidValue,
    LimitExceeded,
    MaxResumes,
    ModelError,
    RunCancelled,
    TokenLimit,
    TurnLimit,
)
from ..keys import idempotency_key
from ..models import WorstCase
from ..state import (
    AssistantMessage,
    Decision,
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
from ..stores import RunHandle
from ..tools import ToolContext
from ..workspace import Workspace
from .records import (
    Decisions,
    Event,
    EventKind,
    HistoryPolicy,
    Limits,
    Save,
    SavePoint,
    answer_problem,
    differences,
    last_stop,
    shielded,
)

__all__ = ["SessionCore"]

log = logging.getLogger("durably.loop")  # the engine's lines keep the loop's logger name


class SessionCore:
    """The part of :class:`~durably.engine.calls.RunSession` that is not about one call.

    See :class:`~durably.engine.calls.RunSession` for what a front end drives and
    the arguments.
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
        stopped = last_stop(state)
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
                run_id=state.run_id, resumes=state.resumes, limit=limit, last_stop=stopped
            )
        state.stop_reason = None
        await self.save(Save.RESTART)
        self.emit("resumed", phase=str(state.phase), turns=state.turns, resumes=state.resumes)

    async def apply_decisions(self, decisions: Decisions) -> None:
        """Record answers a person gave while the run was paused."""
        state = self.state
        changed = False
        for call_id, answer in decisions.items():
            problem = answer_problem(answer, (Yes, No, Rerun, Done))
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

    # -- the calls' record ----------------------------------------------------------------

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
