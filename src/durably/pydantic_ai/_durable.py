"""The ``Durable`` capability: Pydantic AI's public hooks mapped onto durably's engine.

Each hook maps to the engine (:class:`durably.engine.RunSession`) and owns nothing else:

- ``wrap_run`` opens the run under its lock (or saves a new one: save point 1),
  counts the restart, checks the workspace, and closes the handle at the end;
- ``prepare_tools`` (before the first model request) takes each tool's effect from
  its metadata and checks the agent's fingerprint;
- ``wrap_model_request`` answers a request whose reply is saved with that reply (it
  is never paid for twice); otherwise it checks the limits, saves the model-call
  marker, makes the call and saves the reply before any of its calls runs (save point 2);
- ``wrap_tool_execute`` gives a call whose result is saved that result, and sends
  every other call through the engine: approval, the attempt marker with the key
  derived from the run and ``tool_call_id`` (save point 3), the tool, its result
  (save point 4); a call found with a marker goes up the ladder instead; a call that
  waits for a person pauses the run (save point 5) with :class:`RunPaused`.

Nothing is replayed but saved replies and saved results, so neither the model nor
the tools need to be deterministic.

:func:`worker_agent` makes an agent with ``Durable`` something a Postgres worker or
``durably resume --agent`` drives: its runs open on the handle they are given (a
worker's claim) instead of the capability's own store.
"""

from __future__ import annotations

import contextvars
import copy
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import ModelRetry
from pydantic_ai.messages import (
    ModelMessagesTypeAdapter,
    ModelResponse,
    TextPart,
    ToolCallPart,
)
from pydantic_ai.tools import RunContext, ToolDefinition
from pydantic_ai.usage import RequestUsage
from pydantic_core import to_json

from .. import _declarations, faults, frontend
from ..approval import Approver, ScriptedApprover
from ..engine import Decisions, Event, Limits, Outcome, RunSession, shielded
from ..errors import RunCancelled
from ..frontend import NoArguments, saved_reply, saved_result, served_tool_context, serving
from ..keys import validate_run_id
from ..models import Price, WorstCase, sized_worst_case
from ..state import (
    AssistantMessage,
    Effect,
    Phase,
    RunState,
    ToolCall,
    ToolResult,
    Usage,
    utcnow,
)
from ..stores import RunHandle, Store
from ..tools import LookupFunction, Tool, ToolContext
from ..transports.mcp import META_KEY
from ..workspace import Workspace

__all__ = ["Durable", "RunPaused", "WorkerAgent", "key_in_meta", "tool_context", "worker_agent"]


def tool_context() -> ToolContext:
    """The durable context of the tool call being served: run ID, call ID, idempotency key.

    Call it inside a tool of an agent with :class:`Durable`; send
    ``tool_context().idempotency_key`` in the service's channel (an
    ``Idempotency-Key`` header), never in arguments the model writes.

    Raises:
        RuntimeError: called outside a tool call that ``Durable`` is serving.
    """
    return served_tool_context("durably.pydantic_ai", "an agent with the Durable capability")


async def key_in_meta(
    ctx: RunContext[Any], call_tool: Any, name: str, arguments: dict[str, Any]
) -> Any:
    """Send the call's idempotency key in the MCP request's ``_meta``, not in its arguments.

    Give it to Pydantic AI's MCP toolset: ``MCPToolset(..., process_tool_call=key_in_meta)``.
    The key goes under ``io.durably/idempotency-key`` (:data:`durably.transports.META_KEY`),
    as durably's own MCP transport sends it; a server that deduplicates on it makes the
    tool ``keyed``. The model's arguments are sent unchanged.

    Raises:
        RuntimeError: the call is not one ``Durable`` is serving.
    """
    key = tool_context().idempotency_key
    return await call_tool(name, arguments, metadata={META_KEY: key})


class RunPaused(frontend.RunPaused):
    """Raised from ``agent.run`` when a call waits for a person; answer with ``durably answer``.

    The run is saved as paused with its questions (``Durable.outcome(run_id).pending``);
    once they are answered (``durably answer``, the console, or the approver),
    :meth:`Durable.resume` carries it on.
    """

    resume_with = "Durable.resume"


async def _never_called(ctx: ToolContext, **arguments: Any) -> str:
    raise RuntimeError("a Pydantic AI tool runs through its own handler, not this function")


@dataclass
class _Given:
    """A run opened by someone else (a worker's claim), for the next ``wrap_run`` of its ID."""

    handle: RunHandle
    state: RunState
    fresh: bool
    decisions: Decisions = field(default_factory=dict)
    taken: bool = False


_GIVEN: contextvars.ContextVar[_Given | None] = contextvars.ContextVar(
    "durably_pydantic_ai_given", default=None
)


class _Hold:
    """One run's hold, made per run by ``for_run``: the session and where the run is."""

    def __init__(self) -> None:
        self.session: RunSession | None = None
        self.turn = 0
        self.tools: dict[str, Tool] | None = None
        self.sizes: dict[int, tuple[object, int]] = {}
        """Each history message's size as JSON, by ``id`` (the message kept, so no ID is reused)."""


class Durable(AbstractCapability[Any]):
    """Make every run of a Pydantic AI agent durable, on a durably store.

    A run's ID is Pydantic AI's ``run_id`` (give one: ``agent.run(task, run_id=...)``).
    Each tool declares its effect in its metadata (``@agent.tool(metadata={"effect":
    "keyed"})``, optionally ``"key_ttl"`` in seconds and ``"needs_approval"``), or
    falls back to ``default_effect``; a tool with neither is refused before the first
    model call.

    Args:
        store: where runs live (file, journal or Postgres store); None for an agent
            that runs only on the handles a worker gives it (:func:`worker_agent`).
        default_effect: the effect of a tool whose metadata declares none.
        lookups: by tool name, how to ask the service whether an in-doubt call
            happened (``async def(ctx: ToolContext, **arguments) -> Lookup``).
        limits: turn, token, dollar and restart limits over each run's life.
        price: dollars per million tokens (needed for ``limits.max_dollars``).
        max_output_tokens: the most one reply may be billed for, bounding each
            call's worst case under a dollar limit.
        approver: answers approval and in-doubt questions. Required when a tool's
            metadata asks for approval (``TerminalApprover``, ``AskLater``, or
            ``PolicyApprover`` to approve every call); without one, an in-doubt write
            pauses the run for a person.
        workspace: the directory tools write files through, if any.
        clock: the time source for markers and key ages.
        allow_agent_change: resume runs started with a different agent.
        observer: called with every :class:`durably.Event`.
    """

    def __init__(  # noqa: PLR0913 - the public wrapper's options, keyword-only with defaults
        self,
        store: Store | None = None,
        *,
        default_effect: Effect | None = None,
        lookups: Mapping[str, LookupFunction] | None = None,
        limits: Limits | None = None,
        price: Price | None = None,
        max_output_tokens: int | None = None,
        approver: Approver | None = None,
        workspace: Workspace | None = None,
        clock: Callable[[], datetime] = utcnow,
        allow_agent_change: bool = False,
        observer: Callable[[Event], None] | None = None,
    ) -> None:
        self.limits = frontend.checked_options(
            "Durable", default_effect=default_effect, limits=limits, price=price
        )
        self.store = store
        self.default_effect = default_effect
        self.lookups = dict(lookups or {})
        self.price = price
        self.max_output_tokens = max_output_tokens
        self._approver_given = approver  # None: refused once a tool needs approval
        self.approver: Approver = approver or ScriptedApprover()
        self.workspace = workspace
        self.clock = clock
        self.allow_agent_change = allow_agent_change
        self.observer = observer
        self._hold: _Hold | None = None

    # -- entry points -----------------------------------------------------------------

    async def resume(self, agent: Any, run_id: str, **run_options: Any) -> Any:
        """Carry ``run_id`` on from its last save: ``agent.run`` with the run's saved task.

        Saved replies and results are given back without calling the model or the
        tools; the run goes on from its first unanswered call.
        """
        state = await self._the_store().read(run_id)
        return await agent.run(state.task, run_id=run_id, **run_options)

    async def outcome(self, run_id: str) -> Outcome:
        """What the run's last save says: done with its answer, or paused with its questions."""
        return Outcome.from_state(await self._the_store().read(run_id))

    # -- the hooks --------------------------------------------------------------------

    async def for_run(self, ctx: RunContext[Any]) -> Durable:
        """A copy holding this run's session (the capability itself holds none)."""
        bound = copy.copy(self)
        bound._hold = _Hold()  # noqa: SLF001 - the copy's own per-run field, set as it is made
        return bound

    async def wrap_run(self, ctx: RunContext[Any], *, handler: Any) -> Any:
        """Open (or start) the run under its lock for the whole of ``agent.run``."""
        hold = self._the_hold()
        run_id = validate_run_id(ctx.run_id or "")
        given = _GIVEN.get()
        if given is not None and not given.taken and given.handle.run_id == run_id:
            given.taken = True  # the caller (a worker) owns the handle and closes it
            handle, state, fresh, owned = given.handle, given.state, given.fresh, False
        else:
            handle, state, fresh = await frontend.open_or_create(
                self._the_store(), run_id, lambda: _prompt_text(ctx.prompt), clock=self.clock
            )
            owned = True
        try:
            session = hold.session = await frontend.opened_session(
                handle,
                state,
                fresh=fresh,
                limits=self.limits,
                approver=self.approver,
                clock=self.clock,
                workspace=self.workspace,
                observer=self.observer,
            )
            if given is not None and given.taken and given.decisions:
                await session.apply_decisions(given.decisions)
            result = await handler()
            if state.phase is Phase.DONE:
                session.emit("done", answer=state.answer, turns=state.turns, dollars=state.dollars)
            return result
        finally:
            if owned:
                await shielded(handle.close())

    async def prepare_tools(
        self, ctx: RunContext[Any], tool_defs: list[ToolDefinition]
    ) -> list[ToolDefinition]:
        """Before the first model request: each tool's effect, and the agent's fingerprint."""
        hold = self._the_hold()
        if hold.tools is None:
            session = self._session()
            tools = {d.name: self._tool(d) for d in tool_defs}
            # As durably.Agent: no silent approve-all where a tool asks for a person's yes.
            _declarations.check_approver(self._approver_given, tools.values())
            now = frontend.fingerprint(_model_name(ctx), tools)
            if session.state.fingerprint is None:
                session.state.fingerprint = now  # saved with the first model-call marker
            else:
                session.check_agent(now, allow_change=self.allow_agent_change)
            hold.tools = tools
        return tool_defs

    async def wrap_model_request(
        self, ctx: RunContext[Any], *, request_context: Any, handler: Any
    ) -> ModelResponse:
        """A saved reply is given back unpaid; a new one is marked, made and saved first."""
        hold, session = self._the_hold(), self._session()
        state = session.state
        hold.turn += 1
        turn = hold.turn
        saved = saved_reply(state, turn, front="durably.pydantic_ai")
        if saved is not None:
            return _response(saved)
        parameters = request_context.model_request_parameters
        if parameters.output_tools:
            raise ValueError(
                "durably.pydantic_ai covers agents whose output is text: an output tool's "
                f"call ({', '.join(t.name for t in parameters.output_tools)}) is not a "
                "tool call durably can save; use output_type=str"
            )
        if state.phase is Phase.DONE:
            # The framework rejected the saved answer (an output validator asked again).
            state.phase, state.answer, state.stop_reason = Phase.MODEL, None, None
        model = _model_name(ctx)
        worst = self._worst(request_context)
        await session.check_limits(worst, model=model)
        await session.mark_model_call(turn=turn, model=model, worst=worst)
        response: ModelResponse = await handler(request_context)
        faults.point("loop.reply_received")
        calls = tuple(
            ToolCall(id=p.tool_call_id, name=p.tool_name, arguments=p.args_as_json_str())
            for p in response.parts
            if isinstance(p, ToolCallPart)
        )
        session.check_call_ids(calls, model=model)
        usage = Usage(
            input_tokens=response.usage.input_tokens,
            output_tokens=response.usage.output_tokens,
            cache_read_tokens=response.usage.cache_read_tokens,
            cache_write_tokens=response.usage.cache_write_tokens,
        )
        texts = [p.content for p in response.parts if isinstance(p, TextPart)]
        await session.save_reply(
            turn=turn,
            text="".join(texts) if texts else None,
            calls=calls,
            usage=usage,
            dollars=self.price.dollars(usage) if self.price is not None else 0.0,
            model=response.model_name,
        )
        return response

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],
        handler: Any,
    ) -> Any:
        """A saved result is given back; any other call goes through the engine."""
        hold, session = self._the_hold(), self._session()
        state = session.state
        saved = saved_result(state, call.tool_call_id)
        if saved is not None:
            return _replayed(saved)
        tool = (hold.tools or {}).get(tool_def.name) or self._tool(tool_def)
        pending = session.open_calls().get(call.tool_call_id)
        if pending is None and state.model_call is not None:
            # agent.run_stream ends at a reply's first text and runs that reply's calls
            # while the reply is still streaming, so it cannot be saved before they run.
            raise ValueError(
                f"run {state.run_id!r}: call {call.tool_call_id!r} of tool {tool_def.name!r} "
                "belongs to a reply still streaming (agent.run_stream runs the calls of the "
                "reply whose text ends the stream before the reply is complete); durably saves "
                "a reply before its calls run: stream with agent.run_stream_events or "
                "agent.iter, or have the model reply with text only in its last turn"
            )
        if pending is None:
            raise ValueError(
                f"run {state.run_id!r}: call {call.tool_call_id!r} of tool {tool_def.name!r} "
                "is not in a saved reply; durably covers tools the model calls in its replies"
            )
        ran: dict[str, Any] = {}

        async def run(durable: ToolContext) -> str:
            with serving(durable):
                try:
                    value = await handler(args)
                except Exception as exc:
                    ran["error"] = exc  # saved as the call's error result, then raised as it was
                    raise
            ran["value"] = value
            return value if isinstance(value, str) else to_json(value).decode()

        if not await session.settle(pending, tool, dict(args), run=run):
            raise RunPaused(run_id=state.run_id, call_ids=list(state.pending))
        if "error" in ran:
            raise ran["error"]
        if "value" in ran:
            return ran["value"]
        settled = saved_result(state, call.tool_call_id)  # the ladder found it, or a person
        if settled is None:  # pragma: no cover - settle returns True only with a result
            raise RuntimeError(f"call {call.tool_call_id!r} settled without a result")
        return _replayed(settled)

    # -- helpers ----------------------------------------------------------------------

    def _the_hold(self) -> _Hold:
        if self._hold is None:
            raise RuntimeError("Durable's hooks run only inside an agent run (after for_run)")
        return self._hold

    def _the_store(self) -> Store:
        if self.store is None:
            raise ValueError(
                "Durable(store=None) runs only on the handles a worker gives it "
                "(durably.pydantic_ai.worker_agent); give Durable a store to run agent.run "
                "or Durable.resume yourself"
            )
        return self.store

    def _session(self) -> RunSession:
        session = self._the_hold().session
        if session is None:
            raise RuntimeError("Durable's run was not opened: wrap_run did not run first")
        return session

    def _tool(self, definition: ToolDefinition) -> Tool:
        """The engine's view of a Pydantic AI tool: its declared effect, key age and lookup."""
        declared = dict(definition.metadata or {})
        raw = declared.get("effect", self.default_effect)
        if raw is None:
            raise ValueError(
                f"tool {definition.name!r} declares no effect: give it "
                "metadata={'effect': 'read' | 'idempotent' | 'keyed' | 'write'}, or give "
                "Durable a default_effect"
            )
        try:
            effect = Effect(raw)
        except ValueError:
            raise ValueError(
                f"tool {definition.name!r} declares effect {raw!r}; use one of "
                f"{', '.join(e.value for e in Effect)}"
            ) from None
        ttl = declared.get("key_ttl")
        if ttl is not None and effect is not Effect.KEYED:
            raise ValueError(f"tool {definition.name!r}: key_ttl only applies to keyed tools")
        return Tool(
            name=definition.name,
            description=definition.description or definition.name,
            effect=effect,
            function=_never_called,
            arguments=NoArguments,
            schema=dict(definition.parameters_json_schema),
            needs_approval=bool(declared.get("needs_approval", False)),
            key_ttl=None if ttl is None else timedelta(seconds=float(ttl)),
            lookup=self.lookups.get(definition.name),
        )

    def _history_size(self, messages: list[Any]) -> int:
        """The request's history as JSON bytes, each message measured once per run.

        Pydantic AI keeps a run's history as one list of the same message objects, a
        request's new ones appended, so only those are serialized: measuring the whole
        history every turn grew with the run and was most of durably's own cost per turn
        (benchmarks/pydantic_ai_turns.py). Each message counts its own brackets, so the
        sum is a little over the whole list's size, never under.
        """
        sizes = self._the_hold().sizes
        total = 0
        for message in messages:
            known = sizes.get(id(message))
            if known is None or known[0] is not message:
                known = (message, len(ModelMessagesTypeAdapter.dump_json([message])))
                sizes[id(message)] = known
            total += known[1]
        return total

    def _worst(self, request_context: Any) -> WorstCase:
        """The most this request can cost: its size as tokens, plus the output limit."""
        size = self._history_size(request_context.messages)
        tools = request_context.model_request_parameters.function_tools
        size += len(json.dumps([(t.name, t.description, t.parameters_json_schema) for t in tools]))
        settings = request_context.model_settings or {}
        limit = int(self.max_output_tokens or settings.get("max_tokens") or 0)
        return sized_worst_case(size, max_output_tokens=limit, price=self.price)


def _prompt_text(prompt: object) -> str:
    if isinstance(prompt, str):
        return prompt
    raise ValueError(
        "durably.pydantic_ai saves a run's task as text: start the run with a str prompt "
        f"(got {type(prompt).__name__})"
    )


def _model_name(ctx: RunContext[Any]) -> str:
    return str(getattr(ctx.model, "model_name", None) or type(ctx.model).__name__)


def _response(saved: AssistantMessage) -> ModelResponse:
    """The saved reply as Pydantic AI's response: its text, its calls under their IDs, its usage."""
    parts: list[Any] = [TextPart(saved.text)] if saved.text else []
    parts += [ToolCallPart(c.name, c.arguments, tool_call_id=c.id) for c in saved.calls]
    usage = RequestUsage(
        input_tokens=saved.usage.input_tokens,
        output_tokens=saved.usage.output_tokens,
        cache_read_tokens=saved.usage.cache_read_tokens,
        cache_write_tokens=saved.usage.cache_write_tokens,
    )
    return ModelResponse(parts=parts, usage=usage, model_name=saved.model)


def _replayed(saved: ToolResult) -> str:
    """A saved result as the tool's return; a saved error goes back to the model as a retry."""
    if saved.is_error:
        raise ModelRetry(saved.content)
    return saved.content


class WorkerAgent(frontend.Delegating):
    """A Pydantic AI agent with :class:`Durable`, driven on a handle its caller owns.

    What a Postgres worker runs (``durably.postgres.register("refunds", lambda run_id:
    worker_agent(build_agent()))``) and what ``durably resume RUN STORE --agent
    MODULE:FACTORY`` resumes: :meth:`start` saves a new run's first state through
    the handle and runs ``agent.run``; :meth:`drive` carries a saved run on with
    ``agent.run`` of its saved task. Both return the run's :class:`~durably.Outcome`
    (a run that waits for a person is ``paused``, not an exception), as
    ``durably.Agent`` does. The capability's own store is not used.

    Build it with :func:`worker_agent`.
    """

    def __init__(self, agent: Any, durable: Durable, run_options: Mapping[str, Any]) -> None:
        self.agent = agent
        self.durable = durable
        self._front = durable
        self.run_options = dict(run_options)

    async def start(self, handle: RunHandle, task: str) -> Outcome:
        """Start a new run of ``task`` on ``handle``, which owns a run ID with no state yet.

        The first state is saved through ``handle`` (save point 1), then the agent
        runs until it is done or paused. The caller owns ``handle`` and closes it.
        """
        state = await frontend.started_run(handle, _prompt_text(task), clock=self.durable.clock)
        return await self._run(_Given(handle=handle, state=state, fresh=True))

    async def drive(
        self, handle: RunHandle, state: RunState, *, decisions: Decisions | None = None
    ) -> Outcome:
        """Carry a run on from ``state``, its last save, through ``handle``.

        The restart is counted and the agent's fingerprint checked as on any
        resume; ``decisions`` answer questions the run waits for (see
        ``durably.Agent.resume``). The caller owns ``handle`` and closes it.

        Raises:
            ValueError: ``state`` is not the state of ``handle``'s run.
        """
        finished = frontend.given_run(handle, state)
        if finished is not None:
            return finished
        return await self._run(
            _Given(handle=handle, state=state, fresh=False, decisions=dict(decisions or {}))
        )

    async def resume(self, run_id: str, *, decisions: Decisions | None = None) -> Outcome:
        """Open ``run_id`` in the capability's store and :meth:`drive` it."""
        handle, state = await self.durable._the_store().open(run_id)  # noqa: SLF001 - its own
        try:
            return await self.drive(handle, state, decisions=decisions)
        finally:
            await shielded(handle.close())

    async def _run(self, given: _Given) -> Outcome:
        token = _GIVEN.set(given)
        try:
            await self.agent.run(given.state.task, run_id=given.handle.run_id, **self.run_options)
        except (RunPaused, RunCancelled):
            pass  # saved as paused with its questions, or as cancelled: the outcome says so
        finally:
            _GIVEN.reset(token)
        if not given.taken:  # pragma: no cover - worker_agent found the capability
            raise RuntimeError(f"the agent ran run {given.handle.run_id!r} without Durable")
        return Outcome.from_state(given.state)


def worker_agent(agent: Any, **run_options: Any) -> WorkerAgent:
    """``agent`` (a Pydantic AI agent with :class:`Durable`) as a worker drives it.

    Register it with a Postgres worker (``durably.postgres.register(name, lambda run_id:
    worker_agent(build()))``) or name its factory in ``durably resume --agent``.
    ``run_options`` go to every ``agent.run`` (``deps=...``, ``model_settings=...``).

    Raises:
        TypeError: ``agent`` is not a Pydantic AI agent, or has no ``Durable`` capability.
    """
    root = getattr(agent, "root_capability", None)
    if root is None:
        raise TypeError(
            f"worker_agent takes a pydantic_ai.Agent, got {type(agent).__name__}; a "
            "durably.Agent is registered as it is"
        )
    found: list[Durable] = []
    root.apply(
        lambda capability: found.append(capability) if isinstance(capability, Durable) else None
    )
    if len(found) != 1:
        raise TypeError(
            f"worker_agent needs an agent with exactly one Durable capability, found {len(found)}: "
            "build it as Agent(model, capabilities=[durably.pydantic_ai.Durable(...)])"
        )
    return WorkerAgent(agent, found[0], run_options)
