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

The model seam is ``_model``, the pause ``_approvals``, the worker's face ``_worker``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Collection, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeGuard

import msgspec
from agents import Agent, RunConfig, Runner
from agents import RunState as SDKRunState
from agents.handoffs import Handoff
from agents.models.interface import Model
from agents.tool import FunctionTool, set_function_tool_failure_error_function
from agents.tool_context import ToolContext as SDKToolContext

from .. import _declarations, frontend
from ..approval import Approver, ScriptedApprover, Yes
from ..engine import Event, Limits, Outcome, shielded
from ..errors import DurablyError
from ..frontend import NoArguments, saved_result, served_tool_context, serving
from ..keys import validate_run_id
from ..models import Price
from ..state import (
    Decision,
    Effect,
    Phase,
    RunState,
    utcnow,
)
from ..stores import RunHandle, Store
from ..tools import LookupFunction, Tool, ToolContext
from ..workspace import Workspace
from ._approvals import Asker, Hold, call_arguments, needs_nobody, resumed_state, save_pause
from ._model import Pricing, _DurableModel, _DurableProvider

__all__ = [
    "DurableRunner",
    "RunPaused",
    "tool_context",
]

log = logging.getLogger("durably.openai_agents")

_SDK_APPROVED = "RunState.approve"
"""Who answered, in the run's record, for approvals given on the SDK's own RunState."""


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

    @property
    def pricing(self) -> Pricing:
        """The price and output limit each model call's worst case is counted with."""
        return Pricing(self.price, self.max_output_tokens)

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
        config.model_provider = _DurableProvider(config.model_provider, self.pricing, hold)
        if isinstance(config.model, Model):
            config.model = _DurableModel(config.model, self.pricing, hold)
        wrapped = _Wrapper(self, hold).agent(agent)
        try:
            result = await self._run_through(wrapped, hold, config, options, paused)
        except Exception as exc:
            _raise_ours(exc)
            raise
        if result.interruptions:
            await save_pause(hold, result)
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
            start = await resumed_state(wrapped, paused, hold, options)
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
            release = [i for i in result.interruptions if await needs_nobody(hold, i)]
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
            changes["model"] = _DurableModel(agent.model, self.runner.pricing, self.hold)
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


def _raise_ours(exc: BaseException) -> None:
    """Raise the durably error the SDK wrapped (``UserError: Error running tool ...``)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, DurablyError) and seen is not exc:
            raise seen
        seen = seen.__cause__
