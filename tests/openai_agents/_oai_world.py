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
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from agents import Agent, ModelResponse, Usage, function_tool, set_tracing_disabled
from agents.models.interface import Model
from agents.testing import assistant_message, function_call

import durably
from _helpers.peer import kill_once
from durably import Effect, ToolContext
from durably.openai_agents import DurableRunner, tool_context
from durably.stores import Store
from durably.sweep import RUN_ID, Config, World, digest_files

TASK = "refund order 1042, tell the customer, and note it"
ANSWER = "Refunded 1042; customer told; noted."
EMAIL = {"to": "a@b.c", "text": "order 1042 is refunded"}
NOTE = "refund 1042 done"


class Service:
    """The fake service: refunds (deduplicated on keys if asked), e-mails and notes."""

    def __init__(
        self,
        root: Path,
        *,
        honour_keys: bool = True,
        doubt: frozenset[str] = frozenset(),
        kill_after: str | None = None,
    ) -> None:
        self.root = root
        self.honour_keys = honour_keys
        self.doubt = doubt
        """Kinds of effect ("notes") whose request is performed but its answer lost."""
        self.kill_after = kill_after
        """A kind of effect ("refunds") after whose first write the process SIGKILLs itself."""

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
        if name == self.kill_after:
            kill_once(self.root)
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


class OpenAIAgentsJob:
    """The world above as a ``durably.sweep`` job: the sweep's own judge, kills and table."""

    name = "openai-agents refunds"

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
        agent, runner = build(
            world.store(),
            self._service(world),
            self.call_log(world),
            approver=approver,
            config=world.config,
        )
        return DurableAgent(agent, runner)

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
