"""A paused run whose model and tool arguments hold markup, for the console's tests."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

from durably import Agent, Call, Effect, Reply, ScriptedModel, ToolContext, tool
from durably.decisions import AskLater
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
