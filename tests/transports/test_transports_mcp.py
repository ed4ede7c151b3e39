"""MCP tools take effects from their author, send keys in _meta, and the server dedups on them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from mcp.client import Client
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

from durably import Effect, Tool, ToolContext, idempotency_key
from durably.receivers import IdempotencyStore, deduplicated
from durably.state import utcnow
from durably.tools import ToolInputError
from durably.transports import META_KEY, McpToolError, mcp_tools


def context(call_id: str = "c1") -> ToolContext:
    """The context the loop gives a tool for ``call_id`` of run-1."""
    return ToolContext(
        run_id="run-1",
        call_id=call_id,
        idempotency_key=idempotency_key("run-1", call_id),
        workspace=None,
        clock=utcnow,
    )


def orders_server(store: IdempotencyStore | None = None) -> tuple[MCPServer, dict[str, list[Any]]]:
    """A server with a read, an idempotent, a plain and a deduplicated tool; and what it saw."""
    server = MCPServer("orders")
    seen: dict[str, list[Any]] = {"meta": [], "placed": [], "arguments": []}

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def stock(item: str, ctx: Context) -> str:
        """How many of an item are in stock."""
        seen["meta"].append(dict(ctx.request_context.meta or {}))
        return f"{item}: 12"

    @server.tool(annotations=ToolAnnotations(idempotent_hint=True))
    async def set_note(text: str) -> str:
        """Replace the order note."""
        return "ok"

    @server.tool()
    async def cancel(order: int) -> str:
        """Cancel an order."""
        raise ValueError("orders cannot be cancelled")

    async def place(item: str, quantity: int, ctx: Context) -> str:
        """Place an order."""
        seen["meta"].append(dict(ctx.request_context.meta or {}))
        seen["arguments"].append(dict(ctx.request_context.params or {}).get("arguments"))
        seen["placed"].append((item, quantity))
        if item == "unobtainium":
            raise RuntimeError("out of stock")
        return f"order {len(seen['placed'])}: {quantity} x {item}"

    server.tool(name="place_order")(deduplicated(store)(place) if store is not None else place)
    return server, seen


def with_tools(server: MCPServer, body: Callable[[Client], Awaitable[Any]]) -> Any:
    """Run ``body`` with a client connected to ``server``; its result."""

    async def scenario() -> Any:
        async with Client(server) as client:
            return await body(client)

    return asyncio.run(scenario())


KEY_TTL = {"place_order": timedelta(hours=23)}
"""The server keeps keys 24 hours: the agent assumes a little less."""
ALL_EFFECTS = {
    "stock": Effect.READ,
    "set_note": Effect.IDEMPOTENT,
    "cancel": Effect.WRITE,
    "place_order": Effect.KEYED,
}


def test_every_tool_needs_a_declared_effect() -> None:
    """Tools missing from effects are an error naming them; annotations are ignored by default."""
    server, _ = orders_server()

    async def body(client: Client) -> None:
        with pytest.raises(ValueError, match="cancel, place_order, set_note, stock"):
            await mcp_tools(client.session, effects={})
        with pytest.raises(ValueError, match="does not list: refund"):
            await mcp_tools(client.session, effects={**ALL_EFFECTS, "refund": Effect.WRITE})
        only = await mcp_tools(client.session, effects={"cancel": Effect.WRITE}, only=["cancel"])
        assert [(t.name, t.effect) for t in only] == [("cancel", Effect.WRITE)]

    with_tools(server, body)


def test_annotations_count_only_when_trusted_and_never_make_a_tool_keyed() -> None:
    """Trusted annotations give read (readOnlyHint) and idempotent (idempotentHint); effects win."""
    server, _ = orders_server()

    async def body(client: Client) -> dict[str, Effect]:
        tools = await mcp_tools(
            client.session,
            effects={"cancel": Effect.WRITE, "place_order": Effect.KEYED},
            key_ttl=KEY_TTL,
            trust_annotations=True,
        )
        return {t.name: t.effect for t in tools}

    assert with_tools(server, body) == ALL_EFFECTS


def test_the_key_travels_in_meta_and_never_in_the_arguments() -> None:
    """A keyed call carries its key in _meta (io.durably/idempotency-key); a read carries none."""
    server, seen = orders_server()

    async def body(client: Client) -> list[str]:
        tools = {
            t.name: t for t in await mcp_tools(client.session, effects=ALL_EFFECTS, key_ttl=KEY_TTL)
        }
        place, stock = tools["place_order"], tools["stock"]
        return [
            await place(context(), **place.parse('{"item": "widget", "quantity": 2}')),
            await stock(context("c2"), **stock.parse('{"item": "widget"}')),
        ]

    assert with_tools(server, body) == ["order 1: 2 x widget", "widget: 12"]
    assert seen["meta"][0][META_KEY] == idempotency_key("run-1", "c1")
    assert META_KEY not in seen["meta"][1]
    assert seen["arguments"] == [{"item": "widget", "quantity": 2}]


def test_an_error_result_raises_and_bad_arguments_never_leave() -> None:
    """``isError`` is McpToolError; arguments missing a required property fail before sending."""
    server, _ = orders_server()

    async def body(client: Client) -> None:
        tools = {
            t.name: t for t in await mcp_tools(client.session, effects=ALL_EFFECTS, key_ttl=KEY_TTL)
        }
        cancel = tools["cancel"]
        with pytest.raises(McpToolError, match="cancel"):
            await cancel(context(), **cancel.parse('{"order": 1}'))
        with pytest.raises(ToolInputError, match="order"):
            cancel.parse("{}")
        with pytest.raises(ToolInputError, match="JSON object"):
            cancel.parse("[1]")

    with_tools(server, body)


def place_twice(tmp_path: Path, first: str, second: str, *, same_key: bool = True) -> Any:
    """Call the deduplicated place_order twice; return both results (or errors) and the log."""
    store = IdempotencyStore(tmp_path / "keys.sqlite3")
    server, seen = orders_server(store)

    async def body(client: Client) -> list[str]:
        (place,) = await mcp_tools(
            client.session,
            effects={"place_order": Effect.KEYED},
            only=["place_order"],
            key_ttl=KEY_TTL,
        )
        results = []
        for ctx, raw in ((context(), first), (context("c1" if same_key else "c2"), second)):
            tool: Tool = place
            try:
                results.append(await tool(ctx, **tool.parse(raw)))
            except McpToolError as exc:
                results.append(f"error: {exc}")
        return results

    try:
        return with_tools(server, body), seen
    finally:
        store.close()


def test_the_server_runs_a_keyed_call_once_and_replays_its_result(tmp_path: Path) -> None:
    """A second call with the same key gets the first result without the function running."""
    widget = '{"item": "widget", "quantity": 2}'
    results, seen = place_twice(tmp_path, widget, widget)
    assert results == ["order 1: 2 x widget"] * 2
    assert seen["placed"] == [("widget", 2)]
    assert len(seen["meta"]) == 1


def test_the_server_replays_an_error_for_its_key(tmp_path: Path) -> None:
    """A call that failed fails again the same way for its key, without running again."""
    broken = '{"item": "unobtainium", "quantity": 1}'
    results, seen = place_twice(tmp_path, broken, broken)
    assert results[0] == results[1]
    assert results[0].startswith("error:")
    assert seen["placed"] == [("unobtainium", 1)]


def test_the_server_refuses_a_key_reused_with_other_arguments(tmp_path: Path) -> None:
    """The same key with other arguments is an error result, and the function does not run."""
    results, seen = place_twice(
        tmp_path, '{"item": "a", "quantity": 1}', '{"item": "b", "quantity": 1}'
    )
    assert results[0] == "order 1: 1 x a"
    assert "was used before with other arguments" in results[1]
    assert seen["placed"] == [("a", 1)]


def test_calls_with_different_keys_both_run(tmp_path: Path) -> None:
    """Two calls (two keys) with equal arguments are two orders: dedup is by key, not content."""
    widget = '{"item": "widget", "quantity": 2}'
    results, seen = place_twice(tmp_path, widget, widget, same_key=False)
    assert results == ["order 1: 2 x widget", "order 2: 2 x widget"]
    assert len(seen["placed"]) == 2


def test_deduplicated_needs_a_context_parameter(tmp_path: Path) -> None:
    """A tool function without a Context cannot see _meta, so wrapping it fails at once."""
    store = IdempotencyStore(tmp_path / "keys.sqlite3")

    async def place(item: str) -> str:
        return item

    with pytest.raises(TypeError, match="Context"):
        deduplicated(store)(place)
    store.close()
