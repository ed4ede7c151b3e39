"""The model seam: each request of a run answered by its saved reply, or asked and saved.

The Nth request of a run gets the Nth saved reply when there is one (never paid for
twice) as the SDK's ``ModelResponse``; otherwise the limits are checked, the
model-call marker saved, the model asked, and its reply saved before any of its
calls runs (save point 2). A saved reply that calls a tool or handoff the request
does not offer is :class:`ReplayDiverged`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from agents.exceptions import UserError
from agents.handoffs import Handoff
from agents.items import ModelResponse
from agents.models.interface import Model, ModelProvider
from agents.usage import Usage as SDKUsage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from .. import faults
from ..errors import DurablyError
from ..frontend import saved_reply
from ..models import Price, WorstCase, sized_worst_case
from ..state import (
    AssistantMessage,
    Decision,
    Phase,
    ToolCall,
    Usage,
)
from ._approvals import Hold

__all__ = ["Pricing", "ReplayDiverged"]

_SDK_REJECTED = "RunState.reject"
"""Who answered, in the run's record, for a call rejected on the SDK's own RunState."""


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


@dataclass(frozen=True)
class Pricing:
    """What a run's model calls cost: the price, and the output limit the worst case counts."""

    price: Price | None
    max_output_tokens: int | None

    def worst(self, system: str | None, input: Any, tools: list[Any]) -> WorstCase:
        """The most this request can cost: its size as tokens, plus the output limit."""
        size = len(system or "") + len(json.dumps(input, default=str))
        size += len(json.dumps([getattr(t, "name", str(t)) for t in tools]))
        limit = int(self.max_output_tokens or 0)
        return sized_worst_case(size, max_output_tokens=limit, price=self.price)


class _DurableProvider(ModelProvider):
    """The run's provider, each of whose models goes through the engine."""

    def __init__(self, inner: ModelProvider, pricing: Pricing, hold: Hold) -> None:
        self.inner, self.pricing, self.hold = inner, pricing, hold

    def get_model(self, model_name: str | None) -> Model:
        return _DurableModel(self.inner.get_model(model_name), self.pricing, self.hold, model_name)

    async def aclose(self) -> None:
        await self.inner.aclose()


class _DurableModel(Model):
    """A model whose Nth request in the run is answered by the Nth saved reply, if any."""

    def __init__(self, inner: Model, pricing: Pricing, hold: Hold, name: str | None = None) -> None:
        self.inner, self.pricing, self.hold = inner, pricing, hold
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
        worst = self.pricing.worst(system_instructions, input, tools)
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
            dollars=self.pricing.price.dollars(usage) if self.pricing.price is not None else 0.0,
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


def _outputs(input: Any) -> dict[str, str]:
    """The function-call outputs a request holds, by call ID, as text."""
    found: dict[str, str] = {}
    for item in [] if isinstance(input, str) else input or []:
        get = item.get if isinstance(item, dict) else lambda k, i=item: getattr(i, k, None)
        call_id, output = get("call_id"), get("output")
        if get("type") == "function_call_output" and isinstance(call_id, str):
            found[call_id] = output if isinstance(output, str) else json.dumps(output)
    return found


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
