"""A Pydantic AI agent with ``Durable`` against a fake service that counts its effects.

The agent runs on Pydantic AI's own scripted model (``FunctionModel``, no network)
and has four tools, one of each kind durably distinguishes:

- ``refund``: keyed (the service deduplicates on the idempotency key when keys are
  honoured; declared ``write`` with a lookup by key when they are not);
- ``send_email``: a write without a key, with a lookup by content;
- ``post_note``: a write without a key and without a lookup (a person decides);
- ``get_order``: a read.

The service is a directory of JSON-lines files, one line per effect, written with
one ``write`` each, so it survives the SIGKILL of the process that called it. Every
process builds its agent anew from the world's files, as a restarted one would.
:class:`PydanticAIJob` is the same world as a ``durably.sweep`` job.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from pydantic_ai.usage import RequestUsage

import durably
from _helpers.refund_world import ANSWER, EMAIL, NOTE, RefundJob, Service
from durably import ToolContext
from durably.pydantic_ai import Durable, tool_context
from durably.stores import Store
from durably.sweep import RUN_ID, Config, World
from pydantic_ai import Agent, RunContext


def script(turn: int, again: int) -> ModelResponse:
    """The model's reply for ``turn``; ``again`` > 0 when it was asked for it before."""
    suffix = f"-again{again}" if again else ""
    usage = RequestUsage(input_tokens=100 * turn, output_tokens=20)
    if turn == 1:
        parts: list[Any] = [
            TextPart("Looking the order up."),
            ToolCallPart("get_order", {"order": "1042"}, tool_call_id=f"c1{suffix}"),
        ]
    elif turn == 2:
        parts = [
            TextPart("Refunding it."),
            ToolCallPart("refund", {"order": "1042", "cents": 500}, tool_call_id=f"c2{suffix}"),
        ]
    elif turn == 3:
        # Two calls in one reply: Pydantic AI runs them as parallel tasks.
        parts = [
            ToolCallPart("send_email", dict(EMAIL), tool_call_id=f"c3{suffix}"),
            ToolCallPart("post_note", {"text": NOTE}, tool_call_id=f"c4{suffix}"),
        ]
    else:
        parts = [TextPart(ANSWER)]
    return ModelResponse(parts=parts, usage=usage, model_name="scripted")


def scripted_model(log: durably.CallLog, *, fickle: bool = False) -> FunctionModel:
    """Pydantic AI's FunctionModel answering from :func:`script`, logging every ask.

    Fickle, it answers a turn it was asked for before under new call IDs, as a real
    model asked again would not repeat itself.
    """

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages) + 1
        again = log.turns(RUN_ID).count(turn) if fickle else 0
        log.append(RUN_ID, turn)
        return script(turn, again)

    return FunctionModel(reply, model_name="scripted")


def streamed_script(
    response: ModelResponse, *, text_with_calls: bool
) -> list[str | DeltaToolCalls]:
    """``response`` as a model streams it: its text in two chunks, then each call.

    Without ``text_with_calls`` a reply with calls streams only its calls.
    """
    chunks: list[str | DeltaToolCalls] = []
    calls = any(isinstance(p, ToolCallPart) for p in response.parts)
    for index, part in enumerate(response.parts):
        if isinstance(part, TextPart) and (text_with_calls or not calls):
            half = len(part.content) // 2
            chunks += [part.content[:half], part.content[half:]]
        elif isinstance(part, ToolCallPart):
            delta = DeltaToolCall(
                part.tool_name, part.args_as_json_str(), tool_call_id=part.tool_call_id
            )
            chunks.append({index: delta})
    return chunks


def streaming_model(log: durably.CallLog, *, text_with_calls: bool = False) -> FunctionModel:
    """:func:`scripted_model` that also streams: the same replies, chunk by chunk.

    Streamed, a reply with calls has no text unless ``text_with_calls``: under
    ``agent.run_stream`` a reply's first text ends the run.
    """

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages) + 1
        log.append(RUN_ID, turn)
        return script(turn, 0)

    async def stream(
        messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        for chunk in streamed_script(reply(messages, info), text_with_calls=text_with_calls):
            yield chunk

    return FunctionModel(reply, stream_function=stream, model_name="scripted")


def build(  # noqa: C901, PLR0913 - a test world's knobs, keyword-only, one branch each
    store: Store | None,
    service: Service,
    log: durably.CallLog,
    *,
    approver: durably.Approver | None = None,
    config: Config | None = None,
    limits: durably.Limits | None = None,
    price: durably.Price | None = None,
    approval: frozenset[str] = frozenset(),
    streaming: bool = False,
    text_with_calls: bool = False,
) -> tuple[Agent[None, str], Durable]:
    """The agent and its ``Durable`` capability, declared as ``config``'s harness declares them.

    The tools named in ``approval`` need a person's yes before each call. ``streaming``
    gives it a model that streams its replies (the same replies). A worker's agent has
    no store (None): it runs on the run the worker claimed.
    """
    config = config or Config(name="keys honoured")

    async def find_refund(ctx: ToolContext, order: str, cents: int) -> durably.Lookup:
        for entry in service.lines("refunds"):
            if entry["key"] == ctx.idempotency_key:
                return durably.Found(f"refund {entry['id']}")
        return durably.NOT_FOUND

    async def find_email(ctx: ToolContext, to: str, text: str) -> durably.Lookup:
        sent = any(e == {"to": to, "text": text} for e in service.lines("emails"))
        return durably.Found(f"sent to {to}") if sent else durably.NOT_FOUND

    async def assume_done(ctx: ToolContext, **arguments: object) -> durably.Lookup:
        return durably.Found("assumed done (at-most-once baseline)")

    # Declared honestly: keyed only where the service deduplicates on keys.
    refund_meta: dict[str, Any] = (
        {"effect": "keyed", "key_ttl": timedelta(hours=24).total_seconds()}
        if config.honour_keys
        else {"effect": "write"}
    )
    declared = {
        "refund": refund_meta,
        "send_email": {"effect": "write"},
        "post_note": {"effect": "write"},
        "get_order": {"effect": "read"},
    }
    lookups: dict[str, Any] = {"refund": find_refund, "send_email": find_email}
    if not config.lookups:
        lookups = {"refund": find_refund} if config.honour_keys else {}
    if config.baseline == "naive-retry":  # no markers worth the name: rerun everything
        declared = {name: {"effect": "idempotent"} for name in declared}
        lookups = {}
    elif config.baseline == "at-most-once":  # never run an effect again: assume it happened
        declared = {
            n: m if m["effect"] == "read" else {"effect": "write"} for n, m in declared.items()
        }
        lookups = dict.fromkeys(declared, assume_done)

    for name in approval:
        declared[name] = {**declared[name], "needs_approval": True}
    durable = Durable(store, lookups=lookups, approver=approver, limits=limits, price=price)
    model = (
        streaming_model(log, text_with_calls=text_with_calls)
        if streaming
        else scripted_model(log, fickle=config.fickle)
    )
    agent: Agent[None, str] = Agent(model, capabilities=[durable])

    @agent.tool(metadata=declared["refund"])
    async def refund(ctx: RunContext[None], order: str, cents: int) -> str:
        """Refund an order."""
        return service.refund(order=order, key=tool_context().idempotency_key)

    @agent.tool_plain(metadata=declared["send_email"])
    async def send_email(to: str, text: str) -> str:
        """E-mail a customer."""
        return service.send_email(to=to, text=text)

    @agent.tool_plain(metadata=declared["post_note"])
    async def post_note(text: str) -> str:
        """Post a note on the order."""
        return service.post_note(text=text)

    @agent.tool_plain(metadata=declared["get_order"])
    async def get_order(order: str) -> dict[str, Any]:
        """Read an order."""
        return {"order": order, "cents": 500}

    return agent, durable


class DurableAgent:
    """A Pydantic AI agent with ``Durable``, as the sweep runs agents: ``run`` and ``resume``."""

    def __init__(self, agent: Agent[None, str], durable: Durable) -> None:
        self.agent, self.durable = agent, durable

    async def run(self, task: str, *, run_id: str) -> object:
        """``agent.run`` under ``run_id``."""
        return await self.agent.run(task, run_id=run_id)

    async def resume(self, run_id: str) -> object:
        """``Durable.resume``: the run's saved task, under its ID."""
        return await self.durable.resume(self.agent, run_id)


class PydanticAIJob(RefundJob):
    """The refunds world as a ``durably.sweep`` job of this adapter."""

    name = "pydantic-ai refunds"

    def agent(self, world: World, approver: durably.Approver) -> DurableAgent:
        """The agent for this world, built anew in every process."""
        agent, durable = build(
            world.store(),
            self._service(world),
            self.call_log(world),
            approver=approver,
            config=world.config,
        )
        return DurableAgent(agent, durable)
