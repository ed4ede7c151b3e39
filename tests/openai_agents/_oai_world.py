"""An OpenAI Agents SDK agent run by ``DurableRunner`` against a fake service that counts effects.

The agents run on a scripted model implementing the SDK's own ``Model`` interface
(no network). The front-desk agent has four tools, one of each kind durably
distinguishes, and one handoff:

- ``refund``: keyed (the service deduplicates on the idempotency key when keys are
  honoured; declared ``write`` with a lookup by key when they are not);
- ``send_email``: a write without a key, with a lookup by content;
- ``post_note``: a write without a key and without a lookup (a person decides);
- ``get_order``: a read;
- a handoff to the ``closer`` agent, who gives the answer.

The service is a directory of JSON-lines files, one line per effect, written with
one ``write`` each, so it survives the SIGKILL of the process that called it. Every
process builds its agents anew from the world's files, as a restarted one would.
:class:`OpenAIAgentsJob` is the same world as a ``durably.sweep`` job.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

from agents import Agent, ModelResponse, Usage, function_tool, set_tracing_disabled
from agents.models.interface import Model
from agents.testing import assistant_message, function_call

import durably
from _helpers.refund_world import ANSWER, EMAIL, NOTE, RefundJob, Service
from durably import Effect, ToolContext
from durably.openai_agents import DurableRunner, tool_context
from durably.stores import Store
from durably.sweep import RUN_ID, Config, World


def script(outputs: int, again: int, *, sequential: bool = False) -> list[Any]:
    """The model's output items, chosen by how many call outputs the request holds.

    ``again`` > 0 when this reply was asked for before (a fickle model's new call IDs).
    ``sequential`` asks for the e-mail and the note in two replies, not in parallel.
    """
    suffix = f"-again{again}" if again else ""
    if sequential and outputs in (2, 3):
        if outputs == 2:
            return [function_call("send_email", dict(EMAIL), call_id=f"c3{suffix}")]
        return [function_call("post_note", {"text": NOTE}, call_id=f"c4{suffix}")]
    if outputs == 0:
        return [
            assistant_message("Looking the order up."),
            function_call("get_order", {"order": "1042"}, call_id=f"c1{suffix}"),
        ]
    if outputs == 1:
        return [function_call("refund", {"order": "1042", "cents": 500}, call_id=f"c2{suffix}")]
    if outputs == 2:
        # Two calls in one reply: the SDK runs them as parallel tasks.
        return [
            function_call("send_email", dict(EMAIL), call_id=f"c3{suffix}"),
            function_call("post_note", {"text": NOTE}, call_id=f"c4{suffix}"),
        ]
    if outputs == 4:
        return [function_call("transfer_to_closer", {}, call_id=f"c5{suffix}")]
    return [assistant_message(ANSWER)]


class ScriptedModel(Model):
    """The SDK's ``Model`` interface answering from :func:`script`, logging every ask.

    Fickle, it answers a reply it was asked for before under new call IDs, as a real
    model asked again would not repeat itself.
    """

    def __init__(
        self, log: durably.CallLog, *, fickle: bool = False, sequential: bool = False
    ) -> None:
        self.log, self.fickle, self.sequential = log, fickle, sequential

    async def get_response(self, system_instructions: Any, input: Any, *a: Any, **k: Any) -> Any:
        items = [] if isinstance(input, str) else input
        outputs = sum(_kind(i) == "function_call_output" for i in items)
        turns = {0: 1, 1: 2, 2: 3, 3: 4, 4: 5} if self.sequential else {0: 1, 1: 2, 2: 3, 4: 4}
        turn = turns.get(outputs, max(turns.values()) + 1)
        again = self.log.turns(RUN_ID).count(turn) if self.fickle else 0
        self.log.append(RUN_ID, turn)
        usage = Usage(requests=1, input_tokens=100 * turn, output_tokens=20, total_tokens=0)
        output = script(outputs, again, sequential=self.sequential)
        return ModelResponse(output=output, usage=usage, response_id=None)

    def stream_response(self, *a: Any, **k: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the scripted model does not stream")


def _kind(item: Any) -> Any:
    return item.get("type") if isinstance(item, dict) else getattr(item, "type", None)


def build(  # noqa: PLR0913 - a test world's knobs, keyword-only with defaults
    store: Store | None,
    service: Service,
    log: durably.CallLog,
    *,
    approver: durably.Approver | None = None,
    config: Config | None = None,
    limits: durably.Limits | None = None,
    price: durably.Price | None = None,
    approval: frozenset[str] = frozenset(),
    refund_enabled: bool = True,
    sequential: bool = False,
) -> tuple[Agent[Any], DurableRunner]:
    """The front-desk agent and its runner, declared as ``config``'s harness declares them.

    The tools named in ``approval`` need a person's yes before each call; with
    ``refund_enabled`` false the SDK does not offer the refund tool (``is_enabled``);
    ``sequential`` has the model send the e-mail and the note in two replies.
    """
    config = config or Config(name="keys honoured")
    set_tracing_disabled(True)  # no network: nothing to export traces to

    async def find_refund(ctx: ToolContext, **arguments: object) -> durably.Lookup:
        for entry in service.lines("refunds"):
            if entry["key"] == ctx.idempotency_key:
                return durably.Found(f"refund {entry['id']}")
        return durably.NOT_FOUND

    async def find_email(ctx: ToolContext, to: str, text: str) -> durably.Lookup:
        sent = any(e == {"to": to, "text": text} for e in service.lines("emails"))
        return durably.Found(f"sent to {to}") if sent else durably.NOT_FOUND

    async def assume_done(ctx: ToolContext, **arguments: object) -> durably.Lookup:
        return durably.Found("assumed done (at-most-once baseline)")

    effects = {
        "refund": Effect.KEYED if config.honour_keys else Effect.WRITE,
        "send_email": Effect.WRITE,
        "post_note": Effect.WRITE,
        "get_order": Effect.READ,
    }
    key_ttls = {"refund": timedelta(hours=24)} if config.honour_keys else {}
    lookups: dict[str, Any] = {"refund": find_refund, "send_email": find_email}
    if not config.lookups:
        lookups = {"refund": find_refund} if config.honour_keys else {}
    if config.baseline == "naive-retry":  # no markers worth the name: rerun everything
        effects = dict.fromkeys(effects, Effect.IDEMPOTENT)
        lookups, key_ttls = {}, {}
    elif config.baseline == "at-most-once":  # never run an effect again: assume it happened
        effects = {n: e if e is Effect.READ else Effect.WRITE for n, e in effects.items()}
        lookups, key_ttls = dict.fromkeys(effects, assume_done), {}

    model = ScriptedModel(log, fickle=config.fickle, sequential=sequential)
    desk = agents(
        service,
        model,
        key=lambda: tool_context().idempotency_key,
        refund_enabled=refund_enabled,
    )
    runner = DurableRunner(
        store,
        effects=effects,
        lookups=lookups,
        key_ttls=key_ttls,
        approver=approver,
        limits=limits,
        price=price,
        needs_approval=approval,
    )
    return desk, runner


def _as_is(function: Any) -> Any:
    return function


def agents(
    service: Service,
    model: Model,
    *,
    key: Callable[[], str],
    step: Callable[[Any], Any] | None = None,
    refund_enabled: bool = True,
) -> Agent[Any]:
    """The front-desk agent (four tools, a handoff to the closer), on ``model``.

    ``key`` gives the refund its idempotency key inside the call; ``step`` wraps each
    tool's function before the SDK's ``function_tool`` (``DBOS.step()`` for DBOS).
    """
    step = step or _as_is

    @function_tool(is_enabled=refund_enabled)
    @step
    async def refund(order: str, cents: int) -> str:
        """Refund an order."""
        return service.refund(order=order, key=key())

    @function_tool
    @step
    async def send_email(to: str, text: str) -> str:
        """E-mail a customer."""
        return service.send_email(to=to, text=text)

    @function_tool
    @step
    async def post_note(text: str) -> str:
        """Post a note on the order."""
        return service.post_note(text=text)

    @function_tool
    @step
    async def get_order(order: str) -> str:
        """Read an order."""
        return json.dumps({"order": order, "cents": 500})

    closer = Agent(name="closer", instructions="Close the case.", model=model)
    return Agent(
        name="desk",
        instructions="Handle refunds.",
        model=model,
        tools=[refund, send_email, post_note, get_order],
        handoffs=[closer],
    )


class DurableAgent:
    """An SDK agent with its ``DurableRunner``, as the sweep runs agents: ``run`` and ``resume``."""

    def __init__(self, agent: Agent[Any], runner: DurableRunner) -> None:
        self.agent, self.runner = agent, runner

    async def run(self, task: str, *, run_id: str) -> object:
        """``DurableRunner.run`` under ``run_id``."""
        return await self.runner.run(self.agent, task, run_id=run_id)

    async def resume(self, run_id: str) -> object:
        """``DurableRunner.resume``: the run's saved task, under its ID."""
        return await self.runner.resume(self.agent, run_id)


class OpenAIAgentsJob(RefundJob):
    """The refunds world as a ``durably.sweep`` job of this adapter."""

    name = "openai-agents refunds"

    def agent(self, world: World, approver: durably.Approver) -> DurableAgent:
        """The agent for this world, built anew in every process."""
        agent, runner = build(
            world.store(),
            self._service(world),
            self.call_log(world),
            approver=approver,
            config=world.config,
        )
        return DurableAgent(agent, runner)
