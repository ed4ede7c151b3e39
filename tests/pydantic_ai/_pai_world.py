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

import json
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from pydantic_ai.usage import RequestUsage

import durably
from durably import ToolContext
from durably.pydantic_ai import Durable, tool_context
from durably.stores import Store
from durably.sweep import RUN_ID, Config, World, digest_files
from pydantic_ai import Agent, RunContext

TASK = "refund order 1042, tell the customer, and note it"
ANSWER = "Refunded 1042; customer told; noted."
EMAIL = {"to": "a@b.c", "text": "order 1042 is refunded"}
NOTE = "refund 1042 done"


class Service:
    """The fake service: refunds (deduplicated on keys if asked), e-mails and notes."""

    def __init__(
        self, root: Path, *, honour_keys: bool = True, doubt: frozenset[str] = frozenset()
    ) -> None:
        self.root = root
        self.honour_keys = honour_keys
        self.doubt = doubt
        """Kinds of effect ("notes") whose request is performed but its answer lost."""

    def prepare(self) -> None:
        """Make the service's directory."""
        self.root.mkdir(parents=True, exist_ok=True)

    def lines(self, name: str) -> list[dict[str, Any]]:
        """Every record of one kind of effect, in order."""
        path = self.root / f"{name}.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def _append(self, name: str, record: dict[str, Any]) -> None:
        with (self.root / f"{name}.jsonl").open("a") as out:
            out.write(json.dumps(record) + "\n")
        if name in self.doubt:
            raise durably.ToolInDoubt(f"the {name} service took the request and never answered")

    def refund(self, *, order: str, key: str) -> str:
        """Refund an order; with keys honoured, a repeated key gets the first refund back."""
        if self.honour_keys:
            for entry in self.lines("refunds"):
                if entry["key"] == key:
                    return f"refund {entry['id']} (replayed)"
        number = len(self.lines("refunds")) + 1
        self._append("refunds", {"id": number, "order": order, "key": key})
        return f"refund {number}"

    def send_email(self, *, to: str, text: str) -> str:
        """Send an e-mail (no key: a repeat sends it again)."""
        self._append("emails", {"to": to, "text": text})
        return f"sent to {to}"

    def post_note(self, *, text: str) -> str:
        """Post a note (no key, no way to look it up)."""
        self._append("notes", {"text": text})
        return "noted"

    def effects(self) -> Counter[str]:
        """Every effect performed, as a multiset of descriptions."""
        found = Counter(f"refund {e['order']}" for e in self.lines("refunds"))
        found.update(f"email {e['to']}: {e['text']}" for e in self.lines("emails"))
        found.update(f"note {e['text']}" for e in self.lines("notes"))
        return found


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


def build(
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


class PydanticAIJob:
    """The world above as a ``durably.sweep`` job: the sweep's own judge, kills and table."""

    name = "pydantic-ai refunds"

    def _service(self, world: World) -> Service:
        return Service(world.root / "service", honour_keys=world.config.honour_keys)

    def prepare(self, world: World) -> None:
        """Make the service's directory."""
        self._service(world).prepare()

    def task(self) -> str:
        """The task the run is started with."""
        return TASK

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

    def call_log(self, world: World) -> durably.CallLog:
        """Where the model's asks are logged."""
        return durably.CallLog(world.root / "model.jsonl")

    def effects(self, world: World) -> Counter[str]:
        """What the run did to the service."""
        return self._service(world).effects()

    def oracle(self, world: World, request: durably.ResolveRequest) -> durably.Rerun | durably.Done:
        """A person who checks the service: done when the effect is there, else rerun."""
        service = self._service(world)
        arguments = json.loads(request.arguments)
        if request.tool == "refund":
            found = any(e["key"] == request.idempotency_key for e in service.lines("refunds"))
        elif request.tool == "send_email":
            found = arguments in service.lines("emails")
        else:
            found = arguments in service.lines("notes")
        return (
            durably.Done(f"{request.tool} done (checked by a person)") if found else durably.Rerun()
        )

    def checks(self, world: World, state: durably.RunState) -> list[str]:
        """A problem when the run did not end with the scripted answer."""
        return [] if state.answer == ANSWER else [f"wrong answer {state.answer!r}"]

    def fingerprint(self, world: World) -> str:
        """A digest of the files a crash could have changed."""
        service = world.root / "service"
        files: Sequence[Path] = [
            world.store_dir / f"{RUN_ID}.json",
            service / "refunds.jsonl",
            service / "emails.jsonl",
            service / "notes.jsonl",
            world.root / "model.jsonl",
            world.questions_log,
        ]
        return digest_files(files)
