"""The person step through the Agents SDK's own pause: each wrapped tool's ``needs_approval``.

The SDK asks every function call "does this need approval?" before it runs any of the
reply's calls, and a True ends the run with ``result.interruptions`` (its paused state
is ``RunState.to_json()``). durably answers that question for each wrapped tool with
:class:`Asker`, which puts durably's own questions first:

1. a call whose result is saved needs nobody (the wrapper returns the result);
2. a call with an attempt marker and no result is in doubt: the engine climbs the
   ladder here (rerun when harmless, the tool's lookup, then the approver); a verdict
   is kept for the wrapper to act on, and only a person step nobody answered now
   (``deferred``) says True;
3. a tool named in ``DurableRunner(needs_approval=...)`` asks durably's approver (the
   question saved first); True when it defers;
4. otherwise the user's own ``needs_approval`` (a bool or the SDK's callable) decides,
   as the SDK would have asked it.

The answers to durably's questions are saved in durably's state (``durably answer``,
the console); ``DurableRunner.sdk_state`` applies them to the saved SDK state.

The pause itself is here too: :func:`save_pause` saves the SDK's state with the run
(save point 5), :func:`resumed_state` rebuilds it on the wrapped agents, and
:func:`needs_nobody` lets through the SDK's own interruptions no one has to answer.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Mapping
from typing import Any

from agents import Agent
from agents import RunState as SDKRunState
from agents.tool import FunctionTool

from ..engine import RunSession, SavePoint
from ..frontend import saved_result
from ..ladder import Verdict
from ..state import Phase
from ..tools import Tool

__all__ = [
    "Asker",
    "Hold",
    "call_arguments",
    "needs_nobody",
    "resumed_state",
    "save_pause",
]

log = logging.getLogger("durably.openai_agents")


class Hold:
    """One run's hold: the session, the turn reached, the engine's view of each tool.

    ``verdicts`` are the ladder's verdicts reached while the SDK asked ``needs_approval``,
    for the wrapper to act on when the SDK runs the call; ``consulted`` the calls
    durably's ``needs_approval`` was asked about; ``deferred`` the calls a person must
    answer (asked once per process: a second drive says so without asking again).
    """

    def __init__(self, session: RunSession, tools: Mapping[str, Tool]) -> None:
        self.session = session
        self.tools = dict(tools)
        self.turn = 0
        self.handoffs: set[str] = set()
        self.askers: dict[str, Asker] = {}
        self.verdicts: dict[str, Verdict] = {}
        self.consulted: set[str] = set()
        self.deferred: set[str] = set()


def call_arguments(text: str) -> dict[str, Any]:
    """A call's arguments as a lookup is given them: the JSON object, else no arguments.

    Arguments that are not a JSON object (``[1]``, text) reach the tool as the model
    wrote them (the SDK validates them for the tool); the lookup gets none.
    """
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class Asker:
    """A wrapped tool's ``needs_approval``: durably's questions first, then the user's own."""

    def __init__(self, hold: Hold, tool: FunctionTool, engine_tool: Tool) -> None:
        self.hold, self.tool, self.engine_tool = hold, tool, engine_tool
        self.own = tool.needs_approval
        """The user's own setting: False, True or the SDK's callable."""

    async def __call__(self, ctx: Any, params: dict[str, Any], call_id: str) -> bool:
        self.hold.consulted.add(call_id)
        if await self.durably_needs_person(call_id):
            return True
        return await self.user_needs_person(ctx, params, call_id)

    async def durably_needs_person(self, call_id: str) -> bool:
        """True when durably waits for a person about ``call_id`` (its question saved)."""
        hold = self.hold
        session = hold.session
        state = session.state
        if saved_result(state, call_id) is not None:
            return False
        call = session.open_calls().get(call_id)
        if call is None:
            return False  # not in a saved reply: the wrapper says so when the SDK runs it
        if call_id in hold.deferred:
            return True
        marker = state.markers.get(call_id)
        if marker is not None:
            if call_id not in hold.verdicts:
                hold.verdicts[call_id] = await session.judge_in_doubt(
                    call, self.engine_tool, marker, call_arguments(call.arguments)
                )
            if hold.verdicts[call_id].outcome == "deferred":
                hold.deferred.add(call_id)
                return True
            return False
        asks = self.engine_tool.needs_approval and call_id not in state.decisions
        if asks and await session.ask_approval(call, self.engine_tool) is None:
            hold.deferred.add(call_id)
            return True
        return False

    async def user_needs_person(self, ctx: Any, params: dict[str, Any], call_id: str) -> bool:
        """The user's own ``needs_approval``, unless the call is settled or already approved."""
        state = self.hold.session.state
        if self.own is False or saved_result(state, call_id) is not None:
            return False
        if call_id in state.markers:
            return False  # it ran once: its approval was given before
        given = state.decisions.get(call_id)
        if given is not None:
            return not given.approved
        if isinstance(self.own, bool):
            return self.own
        answer: object = self.own(ctx, params, call_id)
        if inspect.isawaitable(answer):
            answer = await answer
        return bool(answer)


async def needs_nobody(hold: Hold, item: Any) -> bool:
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


async def resumed_state(
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


async def save_pause(hold: Hold, result: Any) -> None:
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
