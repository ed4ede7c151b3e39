"""An agent process for the transport tests: runs or resumes one order-placing run.

Usage: ``python _orders_agent.py '<config as JSON>'`` with keys:

- ``command``: ``run`` (under a CrashPlan that SIGKILLs this process just after
  the ``place_order`` call returned, before its result is saved) or ``resume``;
- ``transport``: ``http`` (with ``base_url``) or ``mcp`` (starting
  ``_orders_mcp_server.py`` over stdio on ``server_dir``);
- ``effect``: the effect ``place_order`` is declared with;
- ``lookup``: for HTTP, ``"key"`` (the middleware's ``/idempotency/{key}``),
  ``"reference"`` (the service's search by reference) or null;
- ``key_ttl``: seconds the agent assumes the service remembers keys (``keyed``);
- ``resolve``: what the scripted person answers if asked (``"done"`` or null);
- ``state``, ``questions``: the run store's directory and the approver's log.

A resume prints the outcome as JSON on stdout.
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec

from durably import (
    NEVER_EXPIRES,
    Agent,
    Call,
    Done,
    Effect,
    FileStore,
    Reply,
    ScriptedApprover,
    ScriptedModel,
    Tool,
)
from durably.faults import CrashPlan, installed
from durably.state import ToolResult
from durably.tools import KeyLifetime
from durably.transports import http_tool, mcp_tools

RUN_ID = "orders-run"
TASK = "order two widgets"
ARGUMENTS = '{"item": "widget", "quantity": 2, "reference": "po-17"}'
PERSON_SAYS = "a person checked: order po-17 was placed"
HERE = Path(__file__).parent


class Order(msgspec.Struct, forbid_unknown_fields=True):
    """What the model sends to place an order."""

    item: str
    quantity: int
    reference: str


def http_tools(config: dict[str, Any]) -> list[Tool]:
    base = config["base_url"]
    lookup_url = {
        "key": f"{base}/idempotency/{{key}}",
        "reference": f"{base}/orders/by-reference/{{reference}}",
        None: None,
    }[config.get("lookup")]
    return [
        http_tool(
            name="place_order",
            description="Place an order for a quantity of an item.",
            method="POST",
            url=f"{base}/orders",
            effect=Effect(config["effect"]),
            arguments=Order,
            key_ttl=key_ttl(config),
            lookup_url=lookup_url,
        )
    ]


def key_ttl(config: dict[str, Any]) -> timedelta | KeyLifetime | None:
    """The ``key_ttl`` the config gives, for ever for a keyed tool given none."""
    if "key_ttl" in config:
        return timedelta(seconds=config["key_ttl"])
    return NEVER_EXPIRES if Effect(config["effect"]) is Effect.KEYED else None


async def drive(config: dict[str, Any], tools: list[Tool]) -> None:
    resolve = [Done(PERSON_SAYS)] if config.get("resolve") == "done" else []
    agent = Agent(
        model=ScriptedModel(
            [
                Reply(calls=[Call(id="c1", name="place_order", arguments=ARGUMENTS)]),
                Reply(text="ordered two widgets"),
            ]
        ),
        tools=tools,
        store=FileStore(config["state"]),
        approver=ScriptedApprover(resolve=resolve, log=config["questions"]),
    )
    if config["command"] == "run":
        with installed(CrashPlan(label="loop.tool_returned:place_order")):
            await agent.run(TASK, run_id=RUN_ID)
        sys.exit("the crash point was never reached")
    outcome = await agent.resume(RUN_ID)
    state = outcome.state
    print(
        json.dumps(
            {
                "status": outcome.status,
                "answer": outcome.answer,
                "results": {
                    m.call_id: m.content for m in state.messages if isinstance(m, ToolResult)
                },
                "resolutions": {
                    call_id: [r.step, r.outcome] for call_id, r in state.resolutions.items()
                },
            }
        )
    )


async def main(config: dict[str, Any]) -> None:
    if config["transport"] == "http":
        await drive(config, http_tools(config))
        return
    from mcp import ClientSession, StdioServerParameters, stdio_client

    server = StdioServerParameters(
        command=sys.executable, args=[str(HERE / "_orders_mcp_server.py"), config["server_dir"]]
    )
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        ttl = key_ttl(config)
        tools = await mcp_tools(
            session,
            effects={"place_order": Effect(config["effect"])},
            key_ttl={"place_order": ttl} if ttl is not None else None,
        )
        await drive(config, tools)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
