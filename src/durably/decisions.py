"""The person's side (docs/concepts.md): open questions, and answers saved as decisions.

A run that waits for a person is saved as paused with its questions in
``RunState.pending``. :func:`questions` lists them; :func:`answer` saves a
person's answer into the run's state under the run's lock, exactly as
``Agent.resume(decisions=...)`` records it, so whichever process resumes the run
next (``durably resume``, a worker, the user's service) carries it on with the
answer. The command line (``durably answer``) and the console both call
:func:`answer`; nothing else writes a decision.

An answer is refused (:class:`~durably.errors.AnswerRefused`, nothing saved)
when its question no longer stands (answered already, or the run moved on) or
when it does not fit the question: ``Yes``/``No`` answer an approval,
``Rerun``/``Done`` a call that may have acted.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from .approval import (
    DEFER,
    Answer,
    ApprovalRequest,
    Deferred,
    Done,
    No,
    Rerun,
    ResolveRequest,
    Yes,
)
from .errors import AnswerRefused
from .listing import Question, questions
from .loop import shielded
from .state import (
    AssistantMessage,
    Decision,
    Phase,
    Resolution,
    ResolutionOutcome,
    RunState,
    ToolResult,
    utcnow,
)
from .stores import Store

__all__ = ["WORDS", "AskLater", "Question", "answer", "parse_answer", "questions", "record_answer"]

WORDS = ("yes", "no", "rerun", "done")
"""The answers a person can give, as typed on the command line."""


def parse_answer(word: str, *, reason: str | None = None, result: str | None = None) -> Answer:
    """The answer a person typed: ``yes``, ``no`` (with a reason), ``rerun``, ``done`` (a result).

    Raises:
        ValueError: an unknown word, or ``--reason``/``--result`` with an answer that
            does not take it.
    """
    word = word.strip().lower()
    if word not in WORDS:
        raise ValueError(f"unknown answer {word!r}: answer one of {', '.join(WORDS)}")
    if reason is not None and word != "no":
        raise ValueError("a reason goes with `no` only (the model sees it as the call's result)")
    if result is not None and word != "done":
        raise ValueError("a result goes with `done` only (what the call returned)")
    if word == "yes":
        return Yes()
    if word == "no":
        return No(reason) if reason else No()
    if word == "rerun":
        return Rerun()
    return Done(result if result else "done (confirmed by a person)")


def record_answer(
    state: RunState, *, call_id: str, decision: Answer, now: datetime, by: str | None = None
) -> None:
    """Record a person's answer in ``state`` as ``resume(decisions=...)`` records it.

    ``by`` (who answered) is kept with the decision or the step-3 resolution.

    Raises:
        AnswerRefused: the question does not stand, or the answer does not fit it;
            ``state`` is unchanged.
    """
    pending = state.pending.get(call_id)
    if pending is None:
        raise AnswerRefused(
            run_id=state.run_id, call_id=call_id, reason=_why_not_open(state, call_id)
        )
    call = next((c for c in state.unanswered() if c.id == call_id), None)
    if call is None:  # a question saved for a call that has a result: nothing to decide
        raise AnswerRefused(
            run_id=state.run_id, call_id=call_id, reason="the call already has a result"
        )
    # The same rule as the loop's: Yes/No approve a call that has not run; Rerun/Done
    # settle a call that may have acted (it has an attempt marker).
    in_doubt = call_id in state.markers
    if isinstance(decision, Yes | No) == in_doubt:
        asked = (
            "whether the call happened (rerun or done)"
            if in_doubt
            else "whether the call may run (yes or no)"
        )
        raise AnswerRefused(run_id=state.run_id, call_id=call_id, reason=f"the question is {asked}")
    if isinstance(decision, Yes | No):
        given = Decision(
            approved=isinstance(decision, Yes),
            reason=decision.reason if isinstance(decision, No) else None,
            decided_at=now,
            by=by,
        )
        state.decisions[call_id] = state.approvals_given[call_id] = given
    elif isinstance(decision, Rerun):
        state.resolutions[call_id] = Resolution(
            step=3, outcome=ResolutionOutcome.RERUN, detail="decided", by=by
        )
        state.markers.pop(call_id, None)
    else:
        state.resolutions[call_id] = Resolution(
            step=3, outcome=ResolutionOutcome.DONE, detail="decided", by=by
        )
        state.messages.append(
            ToolResult(call_id=call.id, name=call.name, content=decision.result, is_error=False)
        )
        state.markers.pop(call_id, None)
    state.pending.pop(call_id, None)
    state.answered_at = now
    if not state.unanswered():
        state.phase = Phase.MODEL
        state.decisions.clear()
    elif state.phase is Phase.PAUSED and not state.pending:
        # Claimable again on Postgres: workers take runs whose phase is model or tools.
        state.phase = Phase.TOOLS


def _why_not_open(state: RunState, call_id: str) -> str:
    if state.phase is Phase.DONE:
        return "the run is done"
    if state.phase is Phase.CANCELLED:
        return "the run was cancelled (`durably cancel`): it has no questions and never goes on"
    decision = state.decisions.get(call_id)
    if decision is not None:
        verdict = "approved" if decision.approved else "refused"
        return f"it was already answered ({verdict}); the run waits to be resumed"
    if call_id in state.resolutions and any(c.id == call_id for c in state.unanswered()):
        return f"it was already answered ({state.resolutions[call_id].outcome})"
    if any(c.id == call_id for c in state.unanswered()):
        return "no question about this call is open (the run has not asked about it)"
    known = any(
        c.id == call_id for m in state.messages if isinstance(m, AssistantMessage) for c in m.calls
    )
    return "the call already has a result" if known else "the run has no such call"


async def answer(
    store: Store,
    *,
    run_id: str,
    call_id: str,
    decision: Answer,
    clock: Callable[[], datetime] = utcnow,
    by: str | None = None,
) -> RunState:
    """Save a person's answer to one open question of a run, under the run's lock.

    Args:
        store: where the run lives.
        run_id: the paused run.
        call_id: the call the question is about.
        decision: ``Yes()``/``No(reason)`` for an approval, ``Rerun()``/``Done(result)``
            for an in-doubt call.
        clock: the decision's time.
        by: who answered, kept with the decision (``durably answer`` passes the OS
            user, the console ``console``); None when unknown.

    Returns:
        The state as saved.

    Raises:
        Locked: another process owns the run (it may be answering or running it); try again.
        AnswerRefused: the question does not stand or the answer does not fit; nothing saved.
    """
    handle, state = await store.open(run_id)
    try:
        record_answer(state, call_id=call_id, decision=decision, now=clock(), by=by)
        await shielded(handle.save(state))
    finally:
        await shielded(handle.close())
    return state


class AskLater:
    """An approver that leaves every question to a person answering later.

    The run is saved as paused with its question; ``durably pending`` lists it,
    ``durably answer`` or the console answers it, and a resume carries the run on.
    """

    async def approve(self, request: ApprovalRequest) -> Yes | No | Deferred:
        """Defer: a person answers with ``durably answer`` or the console."""
        return DEFER

    async def resolve(self, request: ResolveRequest) -> Rerun | Done | Deferred:
        """Defer: a person answers with ``durably answer`` or the console."""
        return DEFER
