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
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from typing import Any

from agents.tool import FunctionTool

from ..engine import RunSession
from ..frontend import saved_result
from ..ladder import Verdict
from ..tools import Tool

__all__ = ["Asker", "Hold", "call_arguments"]


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
