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
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
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
from ..engine import Event, Limits, Outcome, RunSession, shielded
from ..frontend import NoArguments, saved_reply, saved_result, served_tool_context, serving
from ..keys import validate_run_id
from ..models import Price, WorstCase
from ..state import (
    AssistantMessage,
    Effect,
    Phase,
    ToolCall,
    ToolResult,
    Usage,
    utcnow,
)
from ..stores import Store
from ..tools import LookupFunction, Tool, ToolContext
from ..workspace import Workspace

__all__ = ["Durable", "RunPaused", "tool_context"]

_FRAMING_TOKENS = 1024
"""Tokens a provider adds around a request, counted generously (as durably's own loop)."""


def tool_context() -> ToolContext:
    """The durable context of the tool call being served: run ID, call ID, idempotency key.

    Call it inside a tool of an agent with :class:`Durable`; send
    ``tool_context().idempotency_key`` in the service's channel (an
    ``Idempotency-Key`` header), never in arguments the model writes.

    Raises:
        RuntimeError: called outside a tool call that ``Durable`` is serving.
    """
    return served_tool_context("durably.pydantic_ai", "an agent with the Durable capability")


class RunPaused(frontend.RunPaused):
    """Raised from ``agent.run`` when a call waits for a person; answer with ``durably answer``.

    The run is saved as paused with its questions (``Durable.outcome(run_id).pending``);
    once they are answered (``durably answer``, the console, or the approver),
    :meth:`Durable.resume` carries it on.
    """

    resume_with = "Durable.resume"


async def _never_called(ctx: ToolContext, **arguments: Any) -> str:
    raise RuntimeError("a Pydantic AI tool runs through its own handler, not this function")


class _Hold:
    """One run's hold, made per run by ``for_run``: the session and where the run is."""

    def __init__(self) -> None:
        self.session: RunSession | None = None
        self.turn = 0
        self.tools: dict[str, Tool] | None = None


class Durable(AbstractCapability[Any]):
    """Make every run of a Pydantic AI agent durable, on a durably store.

    A run's ID is Pydantic AI's ``run_id`` (give one: ``agent.run(task, run_id=...)``).
    Each tool declares its effect in its metadata (``@agent.tool(metadata={"effect":
    "keyed"})``, optionally ``"key_ttl"`` in seconds and ``"needs_approval"``), or
    falls back to ``default_effect``; a tool with neither is refused before the first
    model call.

    Args:
        store: where runs live (file, journal or Postgres store).
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

    def __init__(
        self,
        store: Store,
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
        if default_effect is not None and not isinstance(default_effect, Effect):
            raise TypeError(f"default_effect must be a durably.Effect, got {default_effect!r}")
        self.limits = limits or Limits()
        if self.limits.max_dollars is not None and price is None:
            raise ValueError(
                "Durable(limits=Limits(max_dollars=...)) needs price=durably.Price(...): "
                "without it every call is priced at $0 and the budget cannot hold"
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
        state = await self.store.read(run_id)
        return await agent.run(state.task, run_id=run_id, **run_options)

    async def outcome(self, run_id: str) -> Outcome:
        """What the run's last save says: done with its answer, or paused with its questions."""
        return Outcome.from_state(await self.store.read(run_id))

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
        handle, state, fresh = await frontend.open_or_create(
            self.store, run_id, lambda: _prompt_text(ctx.prompt), clock=self.clock
        )
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
            result = await handler()
            if state.phase is Phase.DONE:
                session.emit("done", answer=state.answer, turns=state.turns, dollars=state.dollars)
            return result
        finally:
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

    def _worst(self, request_context: Any) -> WorstCase:
        """The most this request can cost: its size as tokens, plus the output limit."""
        size = len(ModelMessagesTypeAdapter.dump_json(request_context.messages))
        tools = request_context.model_request_parameters.function_tools
        size += len(json.dumps([(t.name, t.description, t.parameters_json_schema) for t in tools]))
        settings = request_context.model_settings or {}
        limit = self.max_output_tokens or settings.get("max_tokens") or 0
        usage = Usage(input_tokens=size + _FRAMING_TOKENS, output_tokens=int(limit))
        if self.price is None:
            return WorstCase(dollars=0.0, usage=usage, bounded=limit > 0)
        # Priced at the dearest way the provider may bill the input (fresh, cache write or read).
        dearest = max(self.price.input, self.price.cache_write, self.price.cache_read)
        dollars = (usage.input_tokens * dearest + usage.output_tokens * self.price.output) / 1e6
        return WorstCase(dollars=dollars, usage=usage, bounded=limit > 0)


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
