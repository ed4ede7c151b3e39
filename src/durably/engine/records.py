"""The engine's vocabulary: its saves, limits, events and outcomes, and the words it records.

:class:`SavePoint` and :class:`Save` name every save a session makes (each one's
crash-point label derives from it); :class:`Limits`, :class:`Event` and
:class:`Outcome` are what a front end gives a session and gets back.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from .. import _declarations
from .._values import describe, exception_text, text_problem
from ..approval import Done, No, Rerun, Yes
from ..state import (
    Approval,
    Fingerprint,
    Phase,
    RunState,
)

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


def approver_name(approver: object) -> str:
    """How an approver is named where its answers are recorded.

    Its ``name`` attribute when it has a non-empty string one, else its class name
    (``TerminalApprover``).
    """
    name = getattr(approver, "name", None)
    if isinstance(name, str) and name.strip():
        return name
    return type(approver).__name__


def error_text(exc: BaseException) -> str:
    """An exception as the model sees it in an error result, always storable."""
    return exception_text(exc)


def answer_problem(answer: object, allowed: tuple[type, ...]) -> str | None:
    """Why an approver's answer cannot be taken, or None when it can."""
    if not isinstance(answer, allowed):
        names = " or ".join(f"{t.__name__}()" for t in allowed)
        return f"expected {names}, got {describe(answer)}"
    # The dataclasses check their text when built; an object changed since is checked here.
    text = answer.reason if isinstance(answer, No) else getattr(answer, "result", None)
    if isinstance(answer, No | Done):
        return text_problem(text)
    return None


def last_stop(state: RunState) -> str:
    """Where the run's last save left it, in words, for ``MaxResumes``."""
    words = f"phase {state.phase} at turn {state.turns}"
    if state.markers:
        words += f", call(s) {', '.join(sorted(state.markers))} in doubt"
    if state.model_call is not None:
        words += f", waiting for the model's reply to turn {state.model_call.turn}"
    if state.stop_reason:
        words += f", stopped by {state.stop_reason}"
    return words
