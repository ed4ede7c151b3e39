"""A paused run whose model and tool arguments hold markup, for the console's tests."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

from durably import Agent, Call, Effect, Reply, ScriptedModel, ToolContext, ToolInDoubt, tool
from durably.decisions import AskLater
from durably.state import AssistantMessage, ToolCall
from durably.stores.file import FileStore

RUN = "refund-1"
HOSTILE = '<script>document.title="owned"</script><img src=x onerror=alert(1)>'


def agent_for(runs: Path) -> Agent:
    """The agent of :func:`paused_run`, also to resume it."""

    @tool(effect=Effect.KEYED, key_ttl=timedelta(hours=23), needs_approval=True)
    async def refund(ctx: ToolContext, order_id: str) -> str:
        """Refund an order."""
        return f"refunded (key {ctx.idempotency_key})"  # the service's echo of the key sent

    model = ScriptedModel(
        [
            Reply(
                text=f"Refunding. {HOSTILE}",
                calls=[Call(id="c1", name="refund", arguments='{"order_id": "' + "</pre>" + '"}')],
            ),
            Reply(text="done"),
        ]
    )
    return Agent(model=model, tools=[refund], store=FileStore(runs), approver=AskLater())


def paused_run(runs: Path) -> None:
    """A run whose model wrote markup, paused on an approval whose arguments hold markup too."""
    agent = agent_for(runs)
    assert asyncio.run(agent.run(f"refund {HOSTILE}", run_id=RUN)).status == "paused"


LONG = "long-1"


def long_run(runs: Path, size: int) -> None:
    """A finished run whose task, arguments, tool result and reply are each ``size`` characters."""

    @tool(effect=Effect.READ)
    async def look(ctx: ToolContext, query: str) -> str:
        """Look something up."""
        return "r" * size

    model = ScriptedModel(
        [
            Reply(text="t" * size, calls=[Call(id="c1", name="look", arguments=_arguments(size))]),
            Reply(text="a" * size),
        ]
    )
    agent = Agent(model=model, tools=[look], store=FileStore(runs))
    assert asyncio.run(agent.run("k" * size, run_id=LONG)).status == "done"


def _arguments(size: int) -> str:
    return '{"query": "' + "q" * size + '"}'


def many_calls_run(runs: Path, turns: int) -> None:
    """A finished run of ``turns`` replies of five small calls each: a page long to render.

    Rendering it costs Python work per call (escaping, keys, pretty arguments) far
    above what loading it costs, as a run of many turns does.
    """
    long_run(runs, 10)
    store = FileStore(runs)
    handle, state = store.open_sync(LONG)
    arguments = '{"a": [1, 2, {"b": 3}]}'
    replies = [
        AssistantMessage(
            text=f"turn {n}",
            turn=n,
            calls=tuple(
                ToolCall(id=f"k{n}-{j}", name="look", arguments=arguments) for j in range(5)
            ),
        )
        for n in range(turns)
    ]
    state.messages = [*state.messages, *replies]
    handle.save_sync(state)
    handle.close_sync()


DOUBT = "doubt-1"
SAID = "the bank's reply never came <b>(timeout)</b>"
"""What the in-doubt run's tool says with ``ToolInDoubt``: markup, to be shown as text."""


def in_doubt_run(runs: Path) -> None:
    """A run paused on ladder step 3: a refund (a write, no key, no lookup) got no answer."""

    @tool(effect=Effect.WRITE)
    async def refund(ctx: ToolContext, order_id: str, amount: int) -> str:
        """Refund an order."""
        raise ToolInDoubt(SAID)

    model = ScriptedModel(
        [
            Reply(
                calls=[Call(id="c1", name="refund", arguments='{"order_id": "A-17", "amount": 30}')]
            )
        ]
    )
    agent = Agent(model=model, tools=[refund], store=FileStore(runs), approver=AskLater())
    assert asyncio.run(agent.run("refund order A-17", run_id=DOUBT)).status == "paused"
