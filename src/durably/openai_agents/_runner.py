"""``DurableRunner``: the OpenAI Agents SDK's public seams mapped onto durably's engine.

Each seam maps to the engine (:class:`durably.engine.RunSession`) and owns nothing else:

- :meth:`DurableRunner.run` opens the run under its lock (or saves a new one: save
  point 1), counts the restart, checks the agent's fingerprint, and drives
  ``Runner.run`` on a copy of the agent graph (``agent.clone``, handoffs included);
- every model the run asks (``RunConfig(model_provider=...)`` for models named by a
  string, ``agent.clone(model=...)`` for model objects) is wrapped: the Nth request
  of the run is answered with the Nth saved reply when there is one (never paid for
  twice); otherwise the limits are checked, the model-call marker saved, the model
  asked and its reply saved before any of its calls runs (save point 2);
- every ``FunctionTool.on_invoke_tool`` is wrapped: a call whose result is saved gets
  that result; any other call goes through the engine: approval, the attempt marker
  with the key derived from the run and the call ID (save point 3), the tool, its
  result (save point 4); a call found with a marker goes up the ladder;
- every such tool's ``needs_approval`` is durably's (``_approvals.Asker``): a call that
  waits for a person says yes, so the SDK interrupts the run; ``run`` returns with
  ``result.interruptions`` and the run is saved paused with the SDK's
  ``RunState.to_json()`` (save point 5), which :meth:`DurableRunner.sdk_state` gives
  back with the saved answers applied.

Replies are keyed by their place in the run, so the orchestration around them must
decide the same way again: dynamic instructions, guardrails and ``is_enabled`` must
not change which tools or handoffs a request offers. A saved reply that calls a tool
or handoff the request does not offer is :class:`ReplayDiverged`, never a silent re-ask.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeGuard

import msgspec
from agents import Agent, RunConfig, Runner
from agents import RunState as SDKRunState
from agents.exceptions import UserError
from agents.handoffs import Handoff
from agents.items import ModelResponse
from agents.models.interface import Model, ModelProvider
from agents.tool import FunctionTool, set_function_tool_failure_error_function
from agents.tool_context import ToolContext as SDKToolContext
from agents.usage import Usage as SDKUsage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from .. import _declarations, faults, frontend
from ..approval import Approver, ScriptedApprover, Yes
from ..engine import Event, Limits, Outcome, SavePoint, shielded
from ..errors import DurablyError, RunCancelled
from ..frontend import NoArguments, saved_reply, saved_result, served_tool_context, serving
from ..keys import validate_run_id
from ..models import Price, WorstCase
from ..state import (
    AssistantMessage,
    Decision,
    Effect,
    Phase,
    RunState,
    ToolCall,
    Usage,
    utcnow,
)
from ..stores import RunHandle, Store
from ..tools import LookupFunction, Tool, ToolContext
from ..workspace import Workspace
from ._approvals import Asker, Hold, call_arguments

__all__ = [
    "DurableRunner",
    "ReplayDiverged",
    "RunPaused",
    "WorkerAgent",
    "tool_context",
    "worker_agent",
]

log = logging.getLogger("durably.openai_agents")

_SDK_APPROVED, _SDK_REJECTED = "RunState.approve", "RunState.reject"
"""Who answered, in the run's record, for approvals given on the SDK's own RunState."""

_FRAMING_TOKENS = 1024
"""Tokens a provider adds around a request, counted generously (as durably's own loop)."""


def tool_context() -> ToolContext:
    """The durable context of the tool call being served: run ID, call ID, idempotency key.

    Call it inside a function tool of an agent run by :class:`DurableRunner`; send
    ``tool_context().idempotency_key`` in the service's channel (an
    ``Idempotency-Key`` header), never in arguments the model writes.

    Raises:
        RuntimeError: called outside a tool call that ``DurableRunner`` is serving.
    """
    return served_tool_context("durably.openai_agents", "a run driven by DurableRunner")


class RunPaused(frontend.RunPaused):
    """A call waits for a person, and the run could not pause the SDK's way.

    ``DurableRunner.run`` pauses through the SDK (``result.interruptions``); this is
    raised only when a call went in doubt while it ran and driving the run again did
    not reach the SDK's ``needs_approval`` for it. The run is saved as paused with its
    questions (``DurableRunner.outcome(run_id)``); once they are answered (``durably
    answer``, the console, or the approver), :meth:`DurableRunner.resume` carries it on.
    """

    resume_with = "DurableRunner.resume"


class ReplayDiverged(DurablyError):
    """Raised when a saved reply does not fit the request the run makes again.

    The orchestration decided differently this time (dynamic instructions, a
    guardrail, ``is_enabled``, a changed agent): durably will not ask the model again
    silently. Make those decisions deterministic, or start a new run.
    """

    def __init__(self, *, run_id: str, turn: int, reason: str) -> None:
        self.run_id, self.turn, self.reason = run_id, turn, reason
        super().__init__(
            f"run {run_id!r}: the saved reply to turn {turn} does not fit the request made "
            f"again ({reason}); keep instructions, guardrails and is_enabled deterministic "
            "for a run, or start a new run_id"
        )


async def _never_called(ctx: ToolContext, **arguments: Any) -> str:
    raise RuntimeError("an Agents SDK tool runs through its own on_invoke_tool, not this")


class DurableRunner:
    """Run OpenAI Agents SDK agents durably, on a durably store.

    Each function tool's effect is declared here by name (``effects``), or falls back
    to ``default_effect``; a tool with neither is refused before the first model call.

    Args:
        store: where runs live (file, journal or Postgres store); None for a runner
            that runs only on the handles a worker gives it (:func:`worker_agent`).
        effects: each function tool's effect, by tool name.
        default_effect: the effect of a tool ``effects`` does not name.
        lookups: by tool name, how to ask the service whether an in-doubt call
            happened (``async def(ctx: ToolContext, **arguments) -> Lookup``).
        key_ttls: by tool name, how long the service keeps a keyed tool's key.
        needs_approval: tools that need a person's yes (durably's approver) before each call.
        limits: turn, token, dollar and restart limits over each run's life.
        price: dollars per million tokens (needed for ``limits.max_dollars``).
        max_output_tokens: the most one reply may be billed for, bounding each
            call's worst case under a dollar limit.
        approver: answers approval and in-doubt questions. Required when
            ``needs_approval`` names a tool (``TerminalApprover``, ``AskLater``, or
            ``PolicyApprover`` to approve every call); without one, an in-doubt write
            pauses the run for a person.
        workspace: the directory tools write files through, if any.
        clock: the time source for markers and key ages.
        allow_agent_change: resume runs started with a different agent.
        observer: called with every :class:`durably.Event`.
    """

    def __init__(  # noqa: PLR0913 - the public runner's options, keyword-only with defaults
        self,
        store: Store | None,
        *,
        effects: Mapping[str, Effect] | None = None,
        default_effect: Effect | None = None,
        lookups: Mapping[str, LookupFunction] | None = None,
        key_ttls: Mapping[str, timedelta] | None = None,
        needs_approval: Collection[str] = (),
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
            "DurableRunner",
            default_effect=default_effect,
            effects=effects,
            limits=limits,
            price=price,
        )
        for name in key_ttls or {}:
            if (effects or {}).get(name, default_effect) is not Effect.KEYED:
                raise ValueError(f"DurableRunner(key_ttls={{{name!r}: ...}}): only keyed tools")
        self.store = store
        self.effects = dict(effects or {})
        self.default_effect = default_effect
        self.lookups = dict(lookups or {})
        self.key_ttls = dict(key_ttls or {})
        self.needs_approval = frozenset(needs_approval)
        # As durably.Agent: no silent approve-all where a tool asks for a person's yes.
        _declarations.check_someone_approves(approver, self.needs_approval)
        self.price = price
        self.max_output_tokens = max_output_tokens
        self.approver: Approver = approver or ScriptedApprover()
        self.workspace = workspace
        self.clock = clock
        self.allow_agent_change = allow_agent_change
        self.observer = observer

    # -- entry points -----------------------------------------------------------------

    async def run(
        self,
        agent: Agent[Any],
        input: str | SDKRunState[Any, Any],
        *,
        run_id: str,
        run_config: RunConfig | None = None,
        **runner_options: Any,
    ) -> Any:
        """``Runner.run(agent, input)`` made durable under ``run_id``.

        Opens the run (or saves a new one with ``input`` as its task), answers the
        requests it made before from their saved replies and the calls from their
        saved results, and carries it on from there. Returns the SDK's ``RunResult``.

        A call that waits for a person ends the run the SDK's way: the result has
        ``interruptions``, the run is saved as paused with its questions and the SDK's
        ``RunState.to_json()``. Once answered (``durably answer``, the console),
        ``run(agent, await runner.sdk_state(agent, run_id), run_id=run_id)`` carries it
        on from that state (or :meth:`resume` from the task); ``input`` may be any SDK
        ``RunState`` of this run, such as ``result.to_state()`` with the user's own
        approvals given.

        Raises:
            ReplayDiverged: a saved reply does not fit the request made again.
            RunNotFound: ``input`` is an SDK ``RunState`` and no run ``run_id`` is saved.
        """
        run_id = validate_run_id(run_id)
        _check_options(runner_options)
        store = self._the_store()
        paused: dict[str, Any] | None = None
        if isinstance(input, SDKRunState):
            paused = input.to_json()
            handle, state = await store.open(run_id)
            fresh = False
        else:
            text = _task_text(input)
            handle, state, fresh = await frontend.open_or_create(
                store, run_id, lambda: text, clock=self.clock
            )
        try:
            return await self._drive(
                agent,
                handle,
                state,
                fresh=fresh,
                run_config=run_config,
                options=runner_options,
                paused=paused,
            )
        finally:
            await shielded(handle.close())

    async def _drive(
        self,
        agent: Agent[Any],
        handle: RunHandle,
        state: RunState,
        *,
        fresh: bool,
        run_config: RunConfig | None,
        options: Mapping[str, Any],
        paused: dict[str, Any] | None = None,
    ) -> Any:
        """``Runner.run`` of the run ``handle`` holds (the caller closes it).

        From the saved task, or from ``paused`` (an SDK ``RunState.to_json()``).
        """
        session = await frontend.opened_session(
            handle,
            state,
            fresh=fresh,
            limits=self.limits,
            approver=self.approver,
            clock=self.clock,
            workspace=self.workspace,
            observer=self.observer,
        )
        graph = _agents(agent)
        tools = {t.name: self._tool(t) for a in graph for t in a.tools if _is_function(t)}
        now = frontend.fingerprint(_agents_label(agent, graph), tools)
        if state.fingerprint is None:
            state.fingerprint = now  # saved with the first model-call marker
        else:
            session.check_agent(now, allow_change=self.allow_agent_change)
        hold = Hold(session, tools)
        config = dataclasses.replace(run_config) if run_config is not None else RunConfig()
        config.model_provider = _DurableProvider(config.model_provider, self, hold)
        if isinstance(config.model, Model):
            config.model = _DurableModel(config.model, self, hold)
        wrapped = _Wrapper(self, hold).agent(agent)
        try:
            result = await self._run_through(wrapped, hold, config, options, paused)
        except Exception as exc:
            _raise_ours(exc)
            raise
        if result.interruptions:
            await _save_pause(hold, result)
        elif state.phase is Phase.DONE:
            session.emit("done", answer=state.answer, turns=state.turns, dollars=state.dollars)
        return result

    async def _run_through(
        self,
        wrapped: Agent[Any],
        hold: Hold,
        config: RunConfig,
        options: Mapping[str, Any],
        paused: dict[str, Any] | None,
    ) -> Any:
        """``Runner.run`` until it ends or interrupts for a person (or the user's own approval).

        Two things are handled here so that each pause is the SDK's own: a call that went
        in doubt while it ran and waits for a person (the wrapper raised ``RunPaused``)
        has the run driven again from its task, where ``needs_approval`` asks about it;
        and a call the SDK interrupted without asking ``needs_approval`` (its arguments
        are not a JSON object, which the SDK's policy cannot inspect) is let through when
        durably and the user's own setting need nobody for it.
        """
        state = hold.session.state
        start: Any = state.task
        if paused is not None:
            start = await _resumed_state(wrapped, paused, hold, options)
        driven_again = False
        while True:
            try:
                result = await Runner.run(wrapped, start, run_config=config, **options)
            except Exception as exc:
                if driven_again or _found(exc, RunPaused) is None:
                    raise
                driven_again = True
                hold.turn, start = 0, state.task
                continue
            release = [i for i in result.interruptions if await _needs_nobody(hold, i)]
            if not release:
                return result
            start = result.to_state()
            for item in release:
                start.approve(item)

    def run_sync(self, agent: Agent[Any], input: str, *, run_id: str, **options: Any) -> Any:
        """:meth:`run` from synchronous code (not inside a running event loop)."""
        return asyncio.run(self.run(agent, input, run_id=run_id, **options))

    async def resume(self, agent: Agent[Any], run_id: str, **options: Any) -> Any:
        """Carry ``run_id`` on from its last save: :meth:`run` with the run's saved task."""
        state = await self._the_store().read(run_id)
        return await self.run(agent, state.task, run_id=run_id, **options)

    async def sdk_state(
        self, agent: Agent[Any], run_id: str, *, context: Any = None
    ) -> SDKRunState[Any, Any]:
        """The SDK's ``RunState`` the run paused with, with durably's saved answers applied.

        Each interruption durably asked about and a person answered (``durably answer``,
        the console) is approved (yes, rerun, done: the wrapper runs the call or serves
        its saved result) or rejected (no: the model reads why); an unanswered one, and
        the user's own approvals, stay interruptions (approve them on the state as with
        the bare SDK). Carry the run on with ``run(agent, state, run_id=run_id)``.
        ``context``: the run's context, when it is not a mapping the SDK saves.

        Raises:
            ValueError: the run saved no SDK pause (it is not paused, or it paused before
                the SDK's state was saved); carry it on with :meth:`resume`.
        """
        state = await self._the_store().read(run_id)
        if state.paused_with is None:
            raise ValueError(
                f"run {run_id!r} has no SDK pause saved (phase {state.phase}); carry it on "
                "with DurableRunner.resume(agent, run_id), which drives it from its task"
            )
        sdk = await SDKRunState.from_json(agent, state.paused_with, context_override=context)
        for item in sdk.get_interruptions():
            call_id = item.call_id
            if not isinstance(call_id, str):
                continue
            decision = state.decisions.get(call_id)
            rerun = call_id in state.resolutions and call_id not in state.markers
            settled = saved_result(state, call_id) is not None
            if settled or (rerun and call_id not in state.pending):
                sdk.approve(item)  # the wrapper serves the result, or runs the call again
            elif decision is not None and decision.approved:
                sdk.approve(item)
            elif decision is not None:
                sdk.reject(item, rejection_message=_refusal(decision.reason))
        return sdk

    async def outcome(self, run_id: str) -> Outcome:
        """What the run's last save says: done with its answer, or paused with its questions."""
        return Outcome.from_state(await self._the_store().read(run_id))

    def _the_store(self) -> Store:
        if self.store is None:
            raise ValueError(
                "DurableRunner(store=None) runs only on the handles a worker gives it "
                "(durably.openai_agents.worker_agent); give DurableRunner a store to run, "
                "resume or read runs yourself"
            )
        return self.store

    # -- the engine's view of the SDK -------------------------------------------------

    def _tool(self, tool: FunctionTool) -> Tool:
        """The engine's view of a function tool: its declared effect, key age and lookup."""
        effect = self.effects.get(tool.name, self.default_effect)
        if effect is None:
            raise ValueError(
                f"tool {tool.name!r} declares no effect: give DurableRunner "
                f"effects={{{tool.name!r}: Effect.READ | IDEMPOTENT | KEYED | WRITE}}, or a "
                "default_effect"
            )
        return Tool(
            name=tool.name,
            description=tool.description or tool.name,
            effect=effect,
            function=_never_called,
            arguments=NoArguments,
            schema=dict(tool.params_json_schema),
            needs_approval=tool.name in self.needs_approval,
            key_ttl=self.key_ttls.get(tool.name),
            lookup=self.lookups.get(tool.name),
        )

    def _worst(self, system: str | None, input: Any, tools: list[Any]) -> WorstCase:
        """The most this request can cost: its size as tokens, plus the output limit."""
        size = len(system or "") + len(json.dumps(input, default=str))
        size += len(json.dumps([getattr(t, "name", str(t)) for t in tools]))
        limit = self.max_output_tokens or 0
        usage = Usage(input_tokens=size + _FRAMING_TOKENS, output_tokens=int(limit))
        if self.price is None:
            return WorstCase(dollars=0.0, usage=usage, bounded=limit > 0)
        dearest = max(self.price.input, self.price.cache_write, self.price.cache_read)
        dollars = (usage.input_tokens * dearest + usage.output_tokens * self.price.output) / 1e6
        return WorstCase(dollars=dollars, usage=usage, bounded=limit > 0)


class _Wrapper:
    """Copies of the agent graph whose models and function tools go through the engine."""

    def __init__(self, runner: DurableRunner, hold: Hold) -> None:
        self.runner, self.hold = runner, hold
        self._done: dict[int, Agent[Any]] = {}

    def agent(self, agent: Agent[Any]) -> Agent[Any]:
        """``agent`` cloned with its model, tools and handoffs wrapped (each agent once)."""
        done = self._done.get(id(agent))
        if done is not None:
            return done
        changes: dict[str, Any] = {"tools": [self.tool(t) for t in agent.tools]}
        if isinstance(agent.model, Model):
            changes["model"] = _DurableModel(agent.model, self.runner, self.hold)
        clone = agent.clone(**changes)
        self._done[id(agent)] = clone  # before the handoffs: a graph may loop back
        clone.handoffs = [self.handoff(h) for h in agent.handoffs]
        return clone

    def handoff(self, handoff: Any) -> Any:
        if isinstance(handoff, Agent):
            self.hold.handoffs.add(Handoff.default_tool_name(handoff))
            return self.agent(handoff)
        if isinstance(handoff, Handoff):
            self.hold.handoffs.add(handoff.tool_name)
            invoke = handoff.on_invoke_handoff

            async def on_invoke_handoff(ctx: Any, arguments: str) -> Any:
                return self.agent(await invoke(ctx, arguments))

            return dataclasses.replace(handoff, on_invoke_handoff=on_invoke_handoff)
        return handoff

    def tool(self, tool: Any) -> Any:
        if not _is_function(tool):
            return tool  # hosted tools run at the provider: part of the paid reply
        inner = dataclasses.replace(tool)
        # Let the tool's exceptions reach the engine (ToolInDoubt climbs the ladder; any
        # other error is saved as the call's error result, as the SDK would show it).
        set_function_tool_failure_error_function(inner, None)
        engine_tool = self.hold.tools[tool.name]
        hold = self.hold
        asker = hold.askers[tool.name] = Asker(hold, tool, engine_tool)

        async def on_invoke_tool(ctx: SDKToolContext[Any], arguments: str) -> Any:
            session = hold.session
            state = session.state
            call_id = ctx.tool_call_id
            saved = saved_result(state, call_id)
            if saved is not None:
                return saved.content
            pending = session.open_calls().get(call_id)
            if pending is None:
                raise ValueError(
                    f"run {state.run_id!r}: call {call_id!r} of tool {tool.name!r} is not in "
                    "a saved reply; durably covers tools the model calls in its replies"
                )

            async def run(durable: ToolContext) -> str:
                with serving(durable):
                    value = await inner.on_invoke_tool(ctx, arguments)
                return value if isinstance(value, str) else str(value)

            values = call_arguments(arguments)
            own = asker.own is not False and call_id not in state.decisions
            if own and ctx.is_tool_approved(tool.name, call_id):
                # The user's own approval, given on the SDK's RunState: kept in the run's
                # record too (saved with the attempt marker or the result).
                state.decisions[call_id] = state.approvals_given[call_id] = Decision(
                    approved=True, decided_at=session.clock(), by=_SDK_APPROVED
                )
            if engine_tool.needs_approval and call_id in state.pending:
                # durably's question, which the SDK only runs once approved on its RunState
                # (state.approve): that is the person's yes, saved as durably's answer.
                await session.apply_decisions({call_id: Yes()})
                given = msgspec.structs.replace(state.decisions[call_id], by=_SDK_APPROVED)
                state.decisions[call_id] = state.approvals_given[call_id] = given
            verdict = hold.verdicts.pop(call_id, None)
            marker = state.markers.get(call_id)
            if verdict is not None and marker is not None:  # judged when the SDK asked
                ran = await session.act_on_verdict(
                    pending, engine_tool, marker, values, verdict, run=run
                )
            else:
                ran = await session.settle(pending, engine_tool, values, run=run)
            if not ran:
                # In doubt while it ran, a person to ask: the SDK cannot interrupt a call it
                # is running, so the run is driven again (DurableRunner._run_through).
                hold.deferred.add(call_id)
                raise RunPaused(run_id=state.run_id, call_ids=list(state.pending))
            settled = saved_result(state, call_id)
            if settled is None:  # pragma: no cover - settle returns True only with a result
                raise RuntimeError(f"call {call_id!r} settled without a result")
            return settled.content

        return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool, needs_approval=asker)


class _DurableProvider(ModelProvider):
    """The run's provider, each of whose models goes through the engine."""

    def __init__(self, inner: ModelProvider, runner: DurableRunner, hold: Hold) -> None:
        self.inner, self.runner, self.hold = inner, runner, hold

    def get_model(self, model_name: str | None) -> Model:
        return _DurableModel(self.inner.get_model(model_name), self.runner, self.hold, model_name)

    async def aclose(self) -> None:
        await self.inner.aclose()


class _DurableModel(Model):
    """A model whose Nth request in the run is answered by the Nth saved reply, if any."""

    def __init__(
        self, inner: Model, runner: DurableRunner, hold: Hold, name: str | None = None
    ) -> None:
        self.inner, self.runner, self.hold = inner, runner, hold
        self.name = name or str(getattr(inner, "model", None) or type(inner).__name__)

    async def close(self) -> None:
        await self.inner.close()

    async def get_response(  # noqa: PLR0913, PLR0917 - the SDK's Model.get_response signature, positional as the SDK calls it
        self,
        system_instructions: str | None,
        input: Any,
        model_settings: Any,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Handoff[Any, Any]],
        tracing: Any,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        hold, session = self.hold, self.hold.session
        state = session.state
        hold.turn += 1
        turn = hold.turn
        offered = {getattr(t, "name", None) for t in tools} | {h.tool_name for h in handoffs}
        saved = saved_reply(state, turn, front="durably.openai_agents")
        if saved is not None:
            for call in saved.calls:
                if call.name not in offered:
                    raise ReplayDiverged(
                        run_id=state.run_id,
                        turn=turn,
                        reason=f"it calls {call.name!r}, which the request does not offer",
                    )
            return _response(saved)
        await self._close_handoffs(input)
        if state.phase is Phase.DONE:
            raise ReplayDiverged(
                run_id=state.run_id,
                turn=turn,
                reason="the run's saved answer was not accepted as its final output",
            )
        worst = self.runner._worst(system_instructions, input, tools)  # noqa: SLF001
        await session.check_limits(worst, model=self.name)
        state.paused_with = None  # the run goes on: the pause is over (saved with the marker)
        await session.mark_model_call(turn=turn, model=self.name, worst=worst)
        response = await self.inner.get_response(
            system_instructions,
            input,
            model_settings,
            tools,
            output_schema,
            handoffs,
            tracing,
            previous_response_id=previous_response_id,
            conversation_id=conversation_id,
            prompt=prompt,
        )
        faults.point("loop.reply_received")
        texts: list[str] = []
        calls: list[ToolCall] = []
        for item in response.output:
            if isinstance(item, ResponseOutputMessage):
                texts += [c.text for c in item.content if isinstance(c, ResponseOutputText)]
            elif isinstance(item, ResponseFunctionToolCall):
                calls.append(ToolCall(id=item.call_id, name=item.name, arguments=item.arguments))
            else:
                # A reply durably could not give back whole on a restart: refuse it before
                # its save rather than replay a different reply later.
                raise ValueError(
                    f"durably.openai_agents saves text and function calls; the reply holds a "
                    f"{getattr(item, 'type', type(item).__name__)!r} item (hosted tools, "
                    "reasoning items and computer calls are not covered yet)"
                )
        session.check_call_ids(calls, model=self.name)
        details = response.usage.input_tokens_details
        usage = Usage(
            input_tokens=response.usage.input_tokens,
            output_tokens=response.usage.output_tokens,
            cache_read_tokens=getattr(details, "cached_tokens", 0) or 0,
        )
        await session.save_reply(
            turn=turn,
            text="".join(texts) if texts else None,
            calls=calls,
            usage=usage,
            dollars=self.runner.price.dollars(usage) if self.runner.price is not None else 0.0,
            model=self.name,
        )
        return response

    async def _close_handoffs(self, input: Any) -> None:
        """Save a result for the last reply's calls the SDK answered itself.

        Those are its handoffs, and calls it rejected without running them
        (``RunState.reject``), saved with the rejection the request shows the model.
        """
        session = self.hold.session
        answered = _outputs(input)
        for call in list(session.open_calls().values()):
            if call.name in self.hold.handoffs:
                await session.finish(call, f"handed off by {call.name}", False)
            elif call.id in answered and call.id in session.state.markers:
                raise ValueError(
                    f"run {session.state.run_id!r}: call {call.id!r} of tool {call.name!r} "
                    "may have acted, and the SDK's RunState rejected it; a rejection cannot "
                    "say whether it happened: answer it with `durably answer "
                    f"{session.state.run_id} {call.id} rerun|done` (or the console), then "
                    "carry the run on from DurableRunner.sdk_state"
                )
            elif call.id in answered:
                if call.id not in session.state.approvals_given:  # the user's own rejection
                    session.state.approvals_given[call.id] = Decision(
                        approved=False,
                        reason=answered[call.id],
                        decided_at=session.clock(),
                        by=_SDK_REJECTED,
                    )
                await session.finish(call, answered[call.id], True)
            else:
                raise ReplayDiverged(
                    run_id=session.state.run_id,
                    turn=self.hold.turn,
                    reason=f"call {call.id!r} of tool {call.name!r} was never run by the SDK",
                )

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise UserError(
            "durably.openai_agents does not cover Runner.run_streamed yet: use DurableRunner.run"
        )


def _task_text(input: object) -> str:
    if not isinstance(input, str):
        raise ValueError(
            "durably.openai_agents saves a run's task as text: start the run with a str "
            f"input (got {type(input).__name__})"
        )
    return input


def _check_options(options: Mapping[str, Any]) -> None:
    if options.get("session") is not None or options.get("previous_response_id"):
        raise ValueError(
            "DurableRunner keeps the run's history itself: pass no session= or "
            "previous_response_id= (each would change what a replayed request holds)"
        )


def _outputs(input: Any) -> dict[str, str]:
    """The function-call outputs a request holds, by call ID, as text."""
    found: dict[str, str] = {}
    for item in [] if isinstance(input, str) else input or []:
        get = item.get if isinstance(item, dict) else lambda k, i=item: getattr(i, k, None)
        call_id, output = get("call_id"), get("output")
        if get("type") == "function_call_output" and isinstance(call_id, str):
            found[call_id] = output if isinstance(output, str) else json.dumps(output)
    return found


def _refusal(reason: str | None) -> str:
    """What the model reads for a call a person refused (as the engine saves it)."""
    return f"refused by the approver: {reason}"


def _found(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """``exc`` or the first of its causes that is a ``kind``."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kind):
            return seen
        seen = seen.__cause__
    return None


async def _needs_nobody(hold: Hold, item: Any) -> bool:
    """True for an interruption that is nobody's question, to let through.

    The SDK interrupts a call whose arguments are not a JSON object without asking the
    tool's ``needs_approval`` (its policy could not inspect them); when neither durably
    nor the user's own setting needs a person for it, that is only the SDK's default.
    """
    call_id = getattr(item, "call_id", None)
    asker = hold.askers.get(getattr(item, "tool_name", None) or "")
    if asker is None or not isinstance(call_id, str) or call_id in hold.consulted:
        return False
    hold.consulted.add(call_id)
    if asker.own is not False:
        return False  # the user's own policy could not inspect them either: the SDK's answer
    return not await asker.durably_needs_person(call_id)


async def _resumed_state(
    wrapped: Agent[Any], paused: dict[str, Any], hold: Hold, options: Mapping[str, Any]
) -> SDKRunState[Any, Any]:
    """The SDK state ``paused`` rebuilt on the wrapped agents, the turn count set from it."""
    state = hold.session.state
    turns = len(paused.get("model_responses") or [])
    if turns > state.turns:
        raise ValueError(
            f"run {state.run_id!r}: the SDK RunState given holds {turns} model replies and "
            f"the run saved {state.turns}; pass a RunState of this run "
            "(DurableRunner.sdk_state(agent, run_id))"
        )
    hold.turn = turns
    return await SDKRunState.from_json(wrapped, paused, context_override=options.get("context"))


async def _save_pause(hold: Hold, result: Any) -> None:
    """Save the SDK's state at its interruption with the run (save point 5).

    The run is paused whoever's question it is: durably's (in ``pending``, answered with
    ``durably answer``) or only the user's own ``needs_approval`` (answered on the SDK's
    RunState), so no worker claims it meanwhile.
    """
    session = hold.session
    state = session.state
    state.phase = Phase.PAUSED
    try:
        state.paused_with = result.to_state().to_json()
    except Exception as exc:  # noqa: BLE001 - the SDK cannot save it (a context it cannot serialize)
        log.warning(
            "run %s paused, but the SDK could not save its RunState (%s): carry it on with "
            "DurableRunner.resume",
            state.run_id,
            exc,
            extra={"run_id": state.run_id},
        )
        state.paused_with = None
    await session.save(SavePoint.PAUSE)
    session.emit("paused", pending=list(state.pending))


def _is_function(tool: object) -> TypeGuard[FunctionTool]:
    return isinstance(tool, FunctionTool)


def _agents(agent: Agent[Any]) -> list[Agent[Any]]:
    """``agent`` and every agent its handoffs reach (``Handoff`` objects are opaque)."""
    found: dict[int, Agent[Any]] = {}
    todo = [agent]
    while todo:
        one = todo.pop()
        if id(one) in found:
            continue
        found[id(one)] = one
        todo += [h for h in one.handoffs if isinstance(h, Agent)]
    return list(found.values())


def _agents_label(start: Agent[Any], graph: list[Agent[Any]]) -> str:
    """The fingerprint's model label: the starting agent's name, then the others' (sorted)."""
    return " -> ".join([start.name, *sorted(a.name for a in graph if a is not start)])


def _response(saved: AssistantMessage) -> ModelResponse:
    """The saved reply as the SDK's response: its text, its calls under their IDs, its usage."""
    output: list[Any] = []
    if saved.text:
        output.append(
            ResponseOutputMessage(
                id=f"durably-{saved.turn}",
                type="message",
                role="assistant",
                status="completed",
                content=[ResponseOutputText(text=saved.text, type="output_text", annotations=[])],
            )
        )
    output += [
        ResponseFunctionToolCall(
            id=c.id, call_id=c.id, type="function_call", name=c.name, arguments=c.arguments
        )
        for c in saved.calls
    ]
    usage = SDKUsage(
        requests=1,
        input_tokens=saved.usage.input_tokens,
        output_tokens=saved.usage.output_tokens,
        total_tokens=saved.usage.input_tokens + saved.usage.output_tokens,
    )
    return ModelResponse(output=output, usage=usage, response_id=None)


def _raise_ours(exc: BaseException) -> None:
    """Raise the durably error the SDK wrapped (``UserError: Error running tool ...``)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, DurablyError) and seen is not exc:
            raise seen
        seen = seen.__cause__


class WorkerAgent(frontend.Delegating):
    """An Agents SDK agent with its :class:`DurableRunner`, driven on a handle its caller owns.

    What a Postgres worker runs (``durably.postgres.register("refunds", lambda run_id:
    worker_agent(build_agent(), DurableRunner(None, effects=...)))``) and what ``durably
    resume RUN STORE --agent MODULE:FACTORY`` resumes: :meth:`start` saves a new run's
    first state through the handle and runs the agent; :meth:`drive` carries a saved run
    on with its saved task. Both return the run's :class:`~durably.Outcome` (a run that
    waits for a person is ``paused``, not an exception), as ``durably.Agent`` does. The
    runner's own store is not used. Build it with :func:`worker_agent`.
    """

    def __init__(
        self,
        agent: Agent[Any],
        runner: DurableRunner,
        run_config: RunConfig | None,
        options: Mapping[str, Any],
    ) -> None:
        self.agent, self.runner = agent, runner
        self._front = runner
        self.run_config, self.options = run_config, dict(options)

    async def start(self, handle: RunHandle, task: str) -> Outcome:
        """Start a new run of ``task`` on ``handle``, which owns a run ID with no state yet.

        The first state is saved through ``handle`` (save point 1), then the agent
        runs until it is done or paused. The caller owns ``handle`` and closes it.
        """
        state = await frontend.started_run(handle, _task_text(task), clock=self.runner.clock)
        return await self._drive(handle, state, fresh=True)

    async def drive(self, handle: RunHandle, state: RunState) -> Outcome:
        """Carry a run on from ``state``, its last save, through ``handle``.

        The restart is counted and the agent's fingerprint checked as on any resume.
        The caller owns ``handle`` and closes it.

        Raises:
            ValueError: ``state`` is not the state of ``handle``'s run.
        """
        finished = frontend.given_run(handle, state)
        if finished is not None:
            return finished
        return await self._drive(handle, state, fresh=False)

    async def _drive(self, handle: RunHandle, state: RunState, *, fresh: bool) -> Outcome:
        # Saved as paused, or as cancelled (`durably cancel`): the outcome says so.
        with contextlib.suppress(RunPaused, RunCancelled):
            await self.runner._drive(  # noqa: SLF001 - the runner's own seam, kept private
                self.agent,
                handle,
                state,
                fresh=fresh,
                run_config=self.run_config,
                options=self.options,
            )
        return Outcome.from_state(state)


def worker_agent(
    agent: Agent[Any],
    runner: DurableRunner,
    *,
    run_config: RunConfig | None = None,
    **runner_options: Any,
) -> WorkerAgent:
    """``agent`` run by ``runner`` as a worker drives it (a :class:`~durably.frontend.Drivable`).

    Register it with a Postgres worker (``durably.postgres.register(name, lambda run_id:
    worker_agent(build(), DurableRunner(None, effects=...)))``) or name its factory in
    ``durably resume --agent``. ``run_config`` and ``runner_options`` go to every
    ``Runner.run`` (``context=...``, ``max_turns=...``).

    Raises:
        TypeError: ``agent`` is not an Agents SDK agent, or ``runner`` not a DurableRunner.
        ValueError: ``runner_options`` holds ``session`` or ``previous_response_id``.
    """
    if not isinstance(agent, Agent):
        raise TypeError(
            f"worker_agent takes an agents.Agent, got {type(agent).__name__}; a "
            "durably.Agent is registered as it is"
        )
    if not isinstance(runner, DurableRunner):
        raise TypeError(
            f"worker_agent runs the agent through a DurableRunner, got {type(runner).__name__}: "
            "pass DurableRunner(None, effects=...) (a worker gives it each run's handle)"
        )
    _check_options(runner_options)
    return WorkerAgent(agent, runner, run_config, runner_options)
