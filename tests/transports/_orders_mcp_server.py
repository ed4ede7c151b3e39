"""An MCP order server for the transport tests, spoken to over stdio by each agent process.

Usage: ``python _orders_mcp_server.py <directory>``.

``place_order`` appends one line to ``effects.jsonl`` (the effect the tests
count) and returns the order as JSON; it is wrapped by
:func:`durably.receivers.deduplicated` with keys in ``keys.sqlite3``. Every
``tools/call`` that reaches the server is logged to ``received.jsonl`` — its
arguments and its ``_meta`` as they arrived — before deduplication.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from _orders_service import append, lines
from mcp.server.mcpserver import Context, MCPServer

from durably.receivers import IdempotencyStore, deduplicated


def main(directory: str) -> None:
    root = Path(directory)
    store = IdempotencyStore(root / "keys.sqlite3")
    server = MCPServer("orders")

    def logged(function: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(function)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            request = kwargs["ctx"].request_context
            params = dict(request.params or {})
            append(
                root / "received.jsonl",
                {"arguments": params.get("arguments"), "meta": dict(request.meta or {})},
            )
            return await function(*args, **kwargs)

        return wrapper

    @server.tool()
    @logged
    @deduplicated(store)
    async def place_order(item: str, quantity: int, reference: str, ctx: Context) -> str:
        """Place an order for a quantity of an item."""
        effects = root / "effects.jsonl"
        order = {"order": len(lines(effects)) + 1, "item": item, "quantity": quantity}
        append(effects, {**order, "reference": reference})
        return json.dumps(order, sort_keys=True)

    server.run()


if __name__ == "__main__":
    main(*sys.argv[1:])
