"""What every framework front end on :mod:`durably.engine` shares.

A front end (``durably.pydantic_ai``, ``durably.openai_agents``) lets its framework
run the model and the tools and hands each reply and call to a
:class:`~durably.engine.RunSession`. Around that they all need the same few things,
kept here once: the tool context of the call being served, the pause a person's
question ends a run with, the run's fingerprint, and the saved reply and result a
restart hands back instead of asking again. :class:`Drivable` is what a worker
or ``durably resume --agent`` drives, ``durably.Agent`` and each front end's own.
"""

from __future__ import annotations

import contextvars
import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import ClassVar, Protocol, runtime_checkable

import msgspec
import stamina

from . import faults
from .approval import Approver
from .engine import Event, Limits, Outcome, RunSession, SavePoint, shielded
from .errors import DurablyError, Locked, RunCancelled, RunNotFound
from .models import Price
from .state import (
    AssistantMessage,
    Effect,
    Fingerprint,
    Phase,
    RunState,
    ToolPrint,
    ToolResult,
    UserMessage,
)
from .stores import RunHandle, Store
from .tools import Tool, ToolContext
from .workspace import Workspace

__all__ = [
    "Delegating",
    "Drivable",
    "NoArguments",
    "RunPaused",
    "checked_options",
    "fingerprint",
    "given_run",
    "open_or_create",
    "opened_session",
    "saved_reply",
    "saved_result",
    "served_tool_context",
    "serving",
    "started_run",
]


@runtime_checkable
class Drivable(Protocol):
    """An agent that runs on a handle someone else opened (a worker's claim, ``durably resume``).

    ``durably.Agent`` is one; ``durably.pydantic_ai.worker_agent(agent)`` makes one of a
    Pydantic AI agent, ``durably.openai_agents.worker_agent(agent, runner)`` one of an
    OpenAI Agents SDK agent. The caller owns the handle and closes it.
    """

    limits: Limits
    """The run's limits; ``durably resume --max-resumes`` replaces them before driving."""

    async def start(self, handle: RunHandle, task: str) -> Outcome:
        """Save a new run of ``task`` through ``handle`` (save point 1) and drive it."""
        ...

    async def drive(self, handle: RunHandle, state: RunState) -> Outcome:
        """Carry the run on from ``state``, its last save, until it is done or paused."""
        ...


_SERVED: contextvars.ContextVar[ToolContext] = contextvars.ContextVar("durably_served_tool")


@contextmanager
def serving(ctx: ToolContext) -> Iterator[None]:
    """Make ``ctx`` the tool context of the call being served, for the tool to read."""
    token = _SERVED.set(ctx)
    try:
        yield
    finally:
        _SERVED.reset(token)


def served_tool_context(front: str, served_by: str) -> ToolContext:
    """The context :func:`serving` set, or an error naming the front end and what serves calls.

    Raises:
        RuntimeError: called outside a tool call that the front end is serving.
    """
    try:
        return _SERVED.get()
    except LookupError:
        raise RuntimeError(
            f"{front}.tool_context() was called outside a tool call of {served_by}; "
            "call it inside the tool function"
        ) from None


class RunPaused(DurablyError):
    """Raised when a call waits for a person; the run is saved as paused with its questions.

    Once they are answered (``durably answer``, the console, or the approver), the
    front end's ``resume`` carries the run on. Each front end names its own.
    """

    resume_with: ClassVar[str] = "resume"

    def __init__(self, *, run_id: str, call_ids: Sequence[str]) -> None:
        self.run_id = run_id
        self.call_ids = tuple(call_ids)
        calls = ", ".join(self.call_ids) or "none"
        super().__init__(
            f"run {run_id!r} waits for a person about call(s) {calls}; see them with "
            f"`durably pending`, answer with `durably answer {run_id} <call> ...`, then "
            f"carry the run on with {self.resume_with}"
        )


class NoArguments(msgspec.Struct):
    """The arguments of a tool whose framework validates them itself; durably never parses."""


def fingerprint(model: str, tools: Mapping[str, Tool]) -> Fingerprint:
    """What a run was started with: a label for its model (or agents) and each tool's declaration.

    No system prompt is in it: the frameworks may build their instructions per request.
    """
    return Fingerprint(
        model=model,
        system_sha256=hashlib.sha256(b"").hexdigest(),
        tools=tuple(
            ToolPrint(
                name=t.name,
                effect=t.effect,
                schema_sha256=t.schema_sha256,
                needs_approval=t.needs_approval,
            )
            for t in sorted(tools.values(), key=lambda t: t.name)
        ),
    )


def saved_reply(state: RunState, turn: int, *, front: str) -> AssistantMessage | None:
    """The reply saved for ``turn``, or None when the run has not reached it.

    Raises:
        ValueError: the turn was saved but its reply is no longer in the history.
    """
    if turn > state.turns:
        return None
    for message in state.messages:
        if isinstance(message, AssistantMessage) and message.turn == turn:
            return message
    raise ValueError(
        f"run {state.run_id!r} has {state.turns} saved turns but no reply for turn {turn} "
        f"(history folded into a summary is not covered by {front})"
    )


def saved_result(state: RunState, call_id: str) -> ToolResult | None:
    """The result saved for ``call_id``, the latest if there are several; None if none."""
    for message in reversed(state.messages):
        if isinstance(message, ToolResult) and message.call_id == call_id:
            return message
    return None


async def started_run(handle: RunHandle, task: str, *, clock: Callable[[], datetime]) -> RunState:
    """A new run of ``task`` saved through ``handle`` (save point 1), under the handle's run ID.

    What :meth:`Drivable.start` saves before its framework runs.
    """
    state = RunState(
        run_id=handle.run_id, task=task, created_at=clock(), messages=[UserMessage(text=task)]
    )
    await shielded(handle.save(state))  # SavePoint.START
    return state


def given_run(handle: RunHandle, state: RunState) -> Outcome | None:
    """The outcome of a finished run (free: no model or tool call), else None: drive it.

    What :meth:`Drivable.drive` checks first.

    Raises:
        ValueError: ``state`` is not the state of ``handle``'s run.
        RunCancelled: the run was cancelled: it is never carried on.
    """
    if state.run_id != handle.run_id:
        raise ValueError(f"the state of run {state.run_id!r} given with run {handle.run_id!r}")
    if state.phase is Phase.CANCELLED:
        raise RunCancelled(run_id=state.run_id)
    return Outcome.from_state(state) if state.phase is Phase.DONE else None


async def open_or_create(
    store: Store,
    run_id: str,
    task: Callable[[], str],
    *,
    clock: Callable[[], datetime],
    lease_wait: float = 0.0,
) -> tuple[RunHandle, RunState, bool]:
    """The run under its lock, and whether it is new: a new one is saved first (save point 1).

    ``task`` is asked only for a new run: a resumed one carries its saved task. A run
    a lease holds (``Locked`` from a Postgres store) is tried again, with backoff, for
    up to ``lease_wait`` seconds: a front end that already owns the framework's side
    of the run (a LangGraph thread) waits out a dead owner's run lease this way.
    """
    try:
        handle, state = await _open_waiting(store, run_id, lease_wait)
    except RunNotFound:
        text = task()
        state = RunState(
            run_id=run_id, task=text, created_at=clock(), messages=[UserMessage(text=text)]
        )
        return await store.create(state), state, True  # SavePoint.START
    return handle, state, False


async def _open_waiting(store: Store, run_id: str, wait: float) -> tuple[RunHandle, RunState]:
    """``store.open(run_id)``, tried again while a lease holds the run, for ``wait`` seconds."""
    if wait <= 0:
        return await store.open(run_id)
    async for attempt in stamina.retry_context(
        on=lambda exc: isinstance(exc, Locked) and exc.lease,
        attempts=None,
        timeout=wait,
        wait_initial=0.05,
        wait_max=0.5,
        wait_jitter=0.05,
    ):
        with attempt:
            return await store.open(run_id)
    raise AssertionError("unreachable: stamina raises the last Locked")  # pragma: no cover


async def opened_session(  # noqa: PLR0913 - every front end's session options, keyword-only
    handle: RunHandle,
    state: RunState,
    *,
    fresh: bool,
    limits: Limits,
    approver: Approver,
    clock: Callable[[], datetime],
    workspace: Workspace | None,
    observer: Callable[[Event], None] | None,
    restarting: bool | None = None,
) -> RunSession:
    """The engine's session on a run just opened: temp files cleared, the restart counted.

    A new run says it started; an unfinished one counts its restart and checks its
    workspace before anything else happens. ``restarting`` overrides "unfinished"
    for a front end that opens a run more than once per process, or whose run rests
    between its framework's turns (``durably.langgraph``: a thread whose calls are
    all answered is at rest, not crashed).

    Raises:
        RunCancelled: the run was cancelled (``durably cancel``): it is never carried
            on, nor started afresh under its ID.
    """
    if state.phase is Phase.CANCELLED:
        raise RunCancelled(run_id=state.run_id)
    if workspace is not None:
        workspace.remove_temp_files()
    session = RunSession(
        handle,
        state,
        limits=limits,
        approver=approver,
        clock=clock,
        workspace=workspace,
        observer=observer,
    )
    if fresh:
        faults.point(SavePoint.START.crash_point)
        session.emit("started", task=state.task)
    elif (not state.phase.finished) if restarting is None else restarting:
        await session.count_restart()
        session.check_workspace()
    return session


def checked_options(
    owner: str,
    *,
    default_effect: Effect | None,
    effects: Mapping[str, Effect] | None = None,
    limits: Limits | None,
    price: Price | None,
) -> Limits:
    """The front end's limits, after refusing a bad effect or a budget it cannot price.

    ``owner`` names the constructor in the error (``"Durable"``, ``"DurableRunner"``).
    """
    if default_effect is not None and not isinstance(default_effect, Effect):
        raise TypeError(f"default_effect must be a durably.Effect, got {default_effect!r}")
    for name, effect in (effects or {}).items():
        if not isinstance(effect, Effect):
            raise TypeError(f"effects[{name!r}] must be a durably.Effect, got {effect!r}")
    checked = limits or Limits()
    if checked.max_dollars is not None and price is None:
        raise ValueError(
            f"{owner}(limits=Limits(max_dollars=...)) needs price=durably.Price(...): "
            "without it every call is priced at $0 and the budget cannot hold"
        )
    return checked


class _Options(Protocol):
    limits: Limits
    store: Store | None


class Delegating:
    """A worker agent's ``limits`` and ``store``: those of the front end it runs through.

    ``durably resume --max-resumes`` replaces the limits; ``durably resume --agent``
    with no store looks in the store.
    """

    _front: _Options

    @property
    def limits(self) -> Limits:
        """The front end's limits (``durably resume --max-resumes`` replaces them)."""
        return self._front.limits

    @limits.setter
    def limits(self, limits: Limits) -> None:
        self._front.limits = limits

    @property
    def store(self) -> Store | None:
        """The front end's store: where ``durably resume --agent`` with no store looks."""
        return self._front.store
