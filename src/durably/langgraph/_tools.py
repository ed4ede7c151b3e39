"""``DurableTools``: exactly-once tool calls in LangGraph graphs, on durably's engine.

LangGraph re-runs a node that was interrupted: a ``ToolNode`` step whose writes
were not saved runs its calls again. ``DurableTools`` wraps each call
(``ToolNode(wrap_tool_call=..., awrap_tool_call=...)``, or the middleware of
``langchain.agents.create_agent``) and hands it to a
:class:`~durably.engine.RunSession`, which owns nothing LangGraph-specific:

- the thread is a durably run in a durably store (run ID: the thread's key, as
  ``DurablySaver`` names its files), opened under its lock for each call;
- a reply's tool calls are saved as that run's reply (save point 2) the first time
  one of them runs, each under a call ID made of the model message's ID and the
  tool call's ID (a model may reuse tool-call IDs across turns; a message ID is
  not reused), so the idempotency key ``idempotency_key(run, call)`` is unique per
  call and the same every time LangGraph re-runs it;
- a call whose result is saved gets that result back without running the tool;
  any other goes through the engine: approval, the attempt marker (save point 3),
  the tool, its result (save point 4); a call found with a marker goes up the
  ladder (rerun if harmless, lookup, then a person);
- a person is asked through LangGraph's ``interrupt()``: the question is saved
  first (save point 5), so ``durably pending`` lists it and ``durably answer``
  settles it; ``Command(resume=...)`` answers it from the graph's side.

The tool reads its key with :func:`tool_context`, never from its arguments.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from langchain_core.messages import AIMessage, ToolMessage

from .. import frontend
from ..approval import Approver
from ..decisions import AskLater, record_answer
from ..engine import Event, Limits, RunSession, Save, shielded
from ..frontend import NoArguments, saved_result, served_tool_context, serving
from ..keys import validate_run_id
from ..state import Effect, Phase, ToolCall, Usage, utcnow
from ..stores import Store
from ..tools import LookupFunction, Tool, ToolContext
from ._calls import (
    Served,
    ToolErrorMessage,
    call_id,
    decision_of,
    message_of,
    messages_of,
    question_for,
    replayed,
    reply_of,
    text_of,
    usage_of,
)
from ._thread import thread_key

__all__ = ["DurableTools", "tool_context"]

_T = TypeVar("_T")

Execute = Callable[[Any], Any]
"""LangGraph's ``execute``/``handler``: runs the tool for a request, returns its message."""


def tool_context() -> ToolContext:
    """The durable context of the tool call being served: run ID, call ID, idempotency key.

    Call it inside a tool that :class:`DurableTools` wraps; send
    ``tool_context().idempotency_key`` in the service's channel (an
    ``Idempotency-Key`` header), never in arguments the model writes.

    Raises:
        RuntimeError: called outside a tool call that ``DurableTools`` is serving.
    """
    return served_tool_context("durably.langgraph", "DurableTools (wrap_tool_call or middleware)")


@dataclass(frozen=True, kw_only=True)
class _Settled:
    """What settling a call ended with: a message for LangGraph, or a question for a person."""

    message: ToolMessage | None = None
    question: dict[str, Any] | None = None


async def _never_called(ctx: ToolContext, **arguments: Any) -> str:
    raise RuntimeError("a LangGraph tool runs through LangGraph's execute, not this function")


class DurableTools:
    """Exactly-once tool calls for a LangGraph graph: a ``ToolNode`` wrapper and a middleware.

    Give the ``ToolNode`` ``wrap_tool_call=tools.wrap_tool_call`` and
    ``awrap_tool_call=tools.awrap_tool_call``, or give ``create_agent``
    ``middleware=[tools.middleware()]``. Each tool declares its effect in its
    metadata (``@tool(metadata={"effect": "keyed", "key_ttl": 86400})``), in
    ``effects``, or falls back to ``default_effect``; a tool with none is refused
    before it runs.

    Args:
        store: where each thread's calls, markers and results live (a file, journal
            or Postgres store; ``durably pending`` and ``durably answer`` read it).
        effects: by tool name, each tool's effect (its metadata wins).
        default_effect: the effect of a tool that declares none.
        key_ttls: by tool name, how long a keyed tool's service remembers keys (None:
            for ever; metadata ``key_ttl`` in seconds wins).
        lookups: by tool name, how to ask the service whether an in-doubt call
            happened (``async def(ctx: ToolContext, **arguments) -> Lookup``).
        approver: answers approval and in-doubt questions; by default every
            question goes to a person, through ``interrupt()``.
        limits: the restart limit over each thread's life (``max_resumes``).
        clock: the time source for markers and key ages.
        observer: called with every :class:`durably.Event`.

    On a store with leases (Postgres), a thread's run still held by a lease is waited
    for, up to one lease: the graph runs the thread, so whoever held the run died and
    its lease lapses within one lease of the thread's.
    """

    def __init__(  # noqa: PLR0913 - the public wrapper's options, keyword-only with defaults
        self,
        store: Store,
        *,
        effects: Mapping[str, Effect | str] | None = None,
        default_effect: Effect | None = None,
        key_ttls: Mapping[str, timedelta | None] | None = None,
        lookups: Mapping[str, LookupFunction] | None = None,
        approver: Approver | None = None,
        limits: Limits | None = None,
        clock: Callable[[], datetime] = utcnow,
        observer: Callable[[Event], None] | None = None,
    ) -> None:
        if default_effect is not None and not isinstance(default_effect, Effect):
            raise TypeError(f"default_effect must be a durably.Effect, got {default_effect!r}")
        self.store = store
        self.effects = dict(effects or {})
        self.default_effect = default_effect
        self.key_ttls = dict(key_ttls or {})
        self.lookups = dict(lookups or {})
        self.approver: Approver = approver or AskLater()
        self.limits = limits or Limits()
        self.clock = clock
        self.observer = observer
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._seen: set[str] = set()
        """Runs this process has opened: only its first open of one can be a restart."""
        lease = getattr(store, "lease", None)
        self._lease_wait = lease.total_seconds() if isinstance(lease, timedelta) else 0.0
        """How long a thread's run held by a lease is waited for: one lease (the thread is
        this process's, so its holder died; its lease lapses within one)."""

    # -- LangGraph's seams ----------------------------------------------------------------

    def wrap_tool_call(self, request: Any, execute: Execute) -> Any:
        """``ToolNode(wrap_tool_call=...)``: settle the call through durably's engine."""
        served = self._served(request)
        if served is None:
            return execute(request)

        async def run() -> ToolMessage:
            return message_of(execute(request), served)

        return self._drive(served, lambda: self._settle(served, run), _in_own_loop)

    async def awrap_tool_call(self, request: Any, execute: Callable[[Any], Awaitable[Any]]) -> Any:
        """``ToolNode(awrap_tool_call=...)``: the async form of :meth:`wrap_tool_call`."""
        served = self._served(request)
        if served is None:
            return await execute(request)

        async def run() -> ToolMessage:
            return message_of(await execute(request), served)

        while True:
            settled = await self._settle(served, run)
            if settled.message is not None:
                return settled.message
            await self._answer(served, _interrupt(settled.question))

    def effect(
        self,
        runtime: Any,
        function: Callable[[], str],
        *,
        name: str,
        effect: Effect | str,
        key_ttl: timedelta | None = None,
        lookup: LookupFunction | None = None,
        arguments: Mapping[str, Any] | None = None,
    ) -> str:
        """Make a side effect of a custom node exactly once, as a tool call would be.

        ``function`` does the effect and returns its result as text; inside it,
        :func:`tool_context` gives the key. Its identity is the node's task (stable
        while LangGraph re-runs the node from the same checkpoint) and ``name``
        (unique within the node): a re-run node gets the saved result back, and one
        whose effect is in doubt climbs the ladder (``lookup`` is called with
        ``arguments``), up to a person through ``interrupt()``.
        """
        info = getattr(runtime, "execution_info", None)
        if info is None or not info.thread_id:
            raise ValueError(
                f"effect {name!r}: give it the node's runtime (a `runtime: Runtime` parameter) "
                "of a graph compiled with a checkpointer and run with a thread_id"
            )
        given = dict(arguments or {})
        call = ToolCall(id=call_id(str(info.task_id), name), name=name, arguments=json.dumps(given))
        kind = Effect(effect)
        served = Served(
            run_id=validate_run_id(thread_key(str(info.thread_id))),
            call=call,
            tool=Tool(
                name=name,
                description=name,
                effect=kind,
                function=_never_called,
                arguments=NoArguments,
                schema={},
                key_ttl=key_ttl if kind is Effect.KEYED else None,
                lookup=lookup,
            ),
            reply=(call,),
            turn=0,
            usage=Usage(),
            tool_call_id=name,
            arguments=given,
        )

        async def run() -> ToolMessage:
            return ToolMessage(content=function(), tool_call_id=name, name=name)

        message = self._drive(served, lambda: self._settle(served, run), _in_own_loop)
        return text_of(message.content)

    def finish(self, state: Any, runtime: Any) -> None:
        """Save the thread's last reply as its answer (phase ``done``), once it calls no tool.

        The middleware calls it when the agent ends; a ``ToolNode`` graph may call it
        from its last node. A thread between turns rests in phase ``model`` without it.
        """
        ended = self._ended(state, runtime)
        if ended is not None:
            _in_own_loop(lambda: self._finish(*ended))

    async def afinish(self, state: Any, runtime: Any) -> None:
        """The async form of :meth:`finish`."""
        ended = self._ended(state, runtime)
        if ended is not None:
            await self._finish(*ended)

    def middleware(self) -> Any:
        """An ``AgentMiddleware`` for ``langchain.agents.create_agent`` wrapping every tool call."""
        from ._middleware import DurableToolsMiddleware

        return DurableToolsMiddleware(self)

    # -- the engine -----------------------------------------------------------------------

    def _drive(
        self,
        served: Served,
        settle: Callable[[], Coroutine[Any, Any, _Settled]],
        runner: Callable[[Callable[[], Coroutine[Any, Any, Any]]], Any],
    ) -> ToolMessage:
        while True:
            settled: _Settled = runner(settle)
            if settled.message is not None:
                return settled.message
            # Outside the session: the run's lock is free for `durably answer` meanwhile.
            answer = _interrupt(settled.question)
            runner(functools.partial(self._answer, served, answer))

    async def _settle(self, served: Served, run: Callable[[], Awaitable[ToolMessage]]) -> _Settled:
        """Answer one call: its saved result, or the engine's verdict; a question to ask."""
        async with self._session(served.run_id) as session:
            state = session.state
            saved = saved_result(state, served.call.id)
            if saved is not None:
                return _Settled(message=replayed(saved.content, saved.is_error, served))
            if served.call.id not in session.open_calls():
                session.check_call_ids(served.reply, model="langgraph")
                await session.save_reply(
                    turn=max(state.turns + 1, served.turn),
                    text=None,
                    calls=served.reply,
                    usage=served.usage,
                    dollars=0.0,
                    model=None,
                )
            ran: dict[str, ToolMessage] = {}

            async def tool_run(ctx: ToolContext) -> str:
                with serving(ctx):
                    message = await run()
                ran["message"] = message
                if message.status == "error":
                    raise ToolErrorMessage(text_of(message.content))
                return text_of(message.content)

            if served.tool is None:  # pragma: no cover - _served passes these through
                raise RuntimeError("an unregistered tool reached the engine")
            if not await session.settle(served.call, served.tool, served.arguments, run=tool_run):
                return _Settled(question=question_for(session, served))
            if "message" in ran:
                return _Settled(message=ran["message"])
            settled = saved_result(state, served.call.id)  # the ladder found it, or a person
            if settled is None:  # pragma: no cover - settle returns True only with a result
                raise RuntimeError(f"call {served.call.id!r} settled without a result")
            return _Settled(message=replayed(settled.content, settled.is_error, served))

    def _ended(self, state: Any, runtime: Any) -> tuple[str, AIMessage, int] | None:
        info = getattr(runtime, "execution_info", None)
        thread_id = getattr(info, "thread_id", None)
        replies = [m for m in messages_of(state) if isinstance(m, AIMessage)]
        if not thread_id or not replies or replies[-1].tool_calls:
            return None
        return validate_run_id(thread_key(str(thread_id))), replies[-1], len(replies)

    async def _finish(self, run_id: str, message: AIMessage, turn: int) -> None:
        async with self._session(run_id) as session:
            if session.state.turns >= turn or session.open_calls():
                return  # saved already (a re-run of the last step), or a call is open
            await session.save_reply(
                turn=turn,
                text=text_of(message.content),
                calls=(),
                usage=usage_of(message),
                dollars=0.0,
                model=None,
            )

    async def _answer(self, served: Served, value: object) -> None:
        """Save what ``Command(resume=value)`` answered, as ``durably answer`` would."""
        decision = decision_of(value, served)
        async with self._session(served.run_id) as session:
            state = session.state
            if served.call.id not in state.pending:
                return  # answered meanwhile (durably answer, the console): that answer stands
            record_answer(
                state, call_id=served.call.id, decision=decision, now=self.clock(), by="interrupt"
            )
            await session.save(Save.DECISIONS)

    @asynccontextmanager
    async def _session(self, run_id: str) -> AsyncIterator[RunSession]:
        """The run opened under its lock, one call of this process at a time, closed after."""
        with self._guard:
            lock = self._locks.setdefault(run_id, threading.Lock())
        await asyncio.to_thread(lock.acquire)
        try:
            handle, state, fresh = await frontend.open_or_create(
                self.store,
                run_id,
                lambda: f"LangGraph thread {run_id}",
                clock=self.clock,
                lease_wait=self._lease_wait,
            )
            try:
                # A thread whose calls are all answered rests between LangGraph's turns;
                # only a process's first open of a thread with open calls is a restart.
                restarting = run_id not in self._seen and state.phase in (Phase.TOOLS,)
                self._seen.add(run_id)
                session = await frontend.opened_session(
                    handle,
                    state,
                    fresh=fresh,
                    limits=self.limits,
                    approver=self.approver,
                    clock=self.clock,
                    workspace=None,
                    observer=self.observer,
                    restarting=restarting,
                )
                yield session
            finally:
                await shielded(handle.close())
        finally:
            lock.release()

    # -- the call -------------------------------------------------------------------------

    def _served(self, request: Any) -> Served | None:
        """The call of ``request`` as the engine sees it; None for a tool LangGraph refuses."""
        call = request.tool_call
        base = request.tool
        if base is None:
            return None  # not registered: LangGraph answers with an error, nothing runs
        runtime = request.runtime
        info = getattr(runtime, "execution_info", None)
        config = getattr(runtime, "config", None) or {}
        thread_id = getattr(info, "thread_id", None) or config.get("configurable", {}).get(
            "thread_id"
        )
        if not thread_id:
            raise ValueError(
                f"tool {call['name']!r}: durably.langgraph keeps each call under its thread; "
                "compile the graph with a checkpointer and invoke it with "
                '{"configurable": {"thread_id": ...}}'
            )
        message, turn = reply_of(request.state, call["id"])
        if message is not None and message.id:
            anchor = str(message.id)
            calls = list(message.tool_calls)
        else:
            # No model message in the state to name the reply: the checkpoint the step
            # runs from names it (stable while LangGraph re-runs the step from it).
            anchor = str(getattr(info, "checkpoint_id", "") or "")
            calls = [call]
            if not anchor:
                raise ValueError(
                    f"tool {call['name']!r}: neither the model message holding call "
                    f"{call['id']!r} nor the checkpoint it runs from is known"
                )
        reply = tuple(
            ToolCall(id=call_id(anchor, c["id"]), name=c["name"], arguments=json.dumps(c["args"]))
            for c in calls
        )
        me = call_id(anchor, call["id"])
        mine = next((c for c in reply if c.id == me), None)
        if mine is None:
            mine = ToolCall(id=me, name=call["name"], arguments=json.dumps(call["args"]))
            reply = (*reply, mine)
        return Served(
            run_id=validate_run_id(thread_key(str(thread_id))),
            call=mine,
            tool=self._tool(base),
            reply=reply,
            turn=turn,
            usage=usage_of(message),
            tool_call_id=str(call["id"]),
            arguments=dict(call["args"]),
        )

    def _tool(self, base: Any) -> Tool:
        """The engine's view of a LangChain tool: its declared effect, key age and lookup."""
        name = str(base.name)
        declared = dict(getattr(base, "metadata", None) or {})
        raw = declared.get("effect", self.effects.get(name, self.default_effect))
        if raw is None:
            raise ValueError(
                f"tool {name!r} declares no effect: give it metadata={{'effect': 'read' | "
                "'idempotent' | 'keyed' | 'write'}, list it in DurableTools(effects=...), or "
                "give DurableTools a default_effect"
            )
        try:
            effect = Effect(raw)
        except ValueError:
            raise ValueError(
                f"tool {name!r} declares effect {raw!r}; use one of "
                f"{', '.join(e.value for e in Effect)}"
            ) from None
        ttl: timedelta | None = self.key_ttls.get(name)
        if "key_ttl" in declared:
            seconds = declared["key_ttl"]
            ttl = None if seconds is None else timedelta(seconds=float(seconds))
        if ttl is not None and effect is not Effect.KEYED:
            raise ValueError(f"tool {name!r}: key_ttl only applies to keyed tools")
        schema = getattr(base, "tool_call_schema", None)
        try:
            parameters = dict(schema.model_json_schema()) if schema is not None else {}
        except Exception:  # noqa: BLE001 - a schema LangChain cannot render: the name alone identifies it
            parameters = {}
        return Tool(
            name=name,
            description=str(getattr(base, "description", "") or name),
            effect=effect,
            function=_never_called,
            arguments=NoArguments,
            schema=parameters,
            needs_approval=bool(declared.get("needs_approval", False)),
            key_ttl=ttl,
            lookup=self.lookups.get(name),
        )


def _interrupt(question: dict[str, Any] | None) -> object:
    from langgraph.types import interrupt

    return interrupt(question)


def _in_own_loop(factory: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """Run the engine's coroutine to its end from synchronous code, in this thread's context.

    A sync wrapper under an async graph is called on a running loop: the coroutine
    then runs on a loop of its own in a helper thread, with this thread's context.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    context = contextvars.copy_context()
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(context.run, asyncio.run, factory()).result()
