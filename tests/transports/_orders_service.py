"""An order service for the transport tests, run by uvicorn in a process of its own.

Usage: ``python _orders_service.py <listening-socket-fd> <directory> <keys: on|off>``.

``POST /orders`` places an order: one line appended to ``effects.jsonl`` (the
effect the tests count) and ``201`` with the order as JSON. ``GET
/orders/by-reference/{reference}`` finds an order by the caller's reference
(``200`` with the same JSON, or ``404``): a lookup that works without keys.
Every request that reaches the process is logged to ``requests.jsonl`` with
its ``Idempotency-Key`` header, before the middleware sees it. With keys
``on`` the app sits behind :class:`IdempotencyMiddleware`, keys in
``keys.sqlite3`` and lookups at ``/idempotency/{key}``; with ``off`` the
service ignores keys.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from durably.receivers import IdempotencyMiddleware, IdempotencyStore
from durably.receivers.asgi import ASGIApp, Receive, Scope, Send


def append(path: Path, entry: dict[str, Any]) -> None:
    """Append one JSON line with a single write, so a killed process never leaves half of one."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(entry, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)


def lines(path: Path) -> list[dict[str, Any]]:
    """Every JSON line of a log, in order."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def render(order: dict[str, Any]) -> Response:
    """The same bytes for an order whether it was just placed or found later."""
    return Response(json.dumps(order, sort_keys=True), media_type="application/json")


def build(directory: Path, *, keys: bool) -> ASGIApp:
    """The service's ASGI app."""
    effects = directory / "effects.jsonl"

    async def place(request: Request) -> Response:
        data = await request.json()
        order = {"order": len(lines(effects)) + 1, **data}
        append(effects, order)
        response = render(order)
        response.status_code = 201
        return response

    async def by_reference(request: Request) -> Response:
        reference = request.path_params["reference"]
        found = [o for o in lines(effects) if o.get("reference") == reference]
        if not found:
            return JSONResponse({"reference": reference, "found": False}, status_code=404)
        return render(found[0])

    app: ASGIApp = Starlette(
        routes=[
            Route("/orders", place, methods=["POST"]),
            Route("/orders/by-reference/{reference}", by_reference, methods=["GET"]),
        ]
    )
    if keys:
        store = IdempotencyStore(directory / "keys.sqlite3")
        app = IdempotencyMiddleware(app, store=store, lookup_path="/idempotency")
    requests = directory / "requests.jsonl"

    async def logged(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = {k.decode(): v.decode() for k, v in scope["headers"]}
            entry = {"method": scope["method"], "path": scope["path"]}
            append(requests, {**entry, "key": headers.get("idempotency-key")})
        await app(scope, receive, send)

    return logged


def main(fd: str, directory: str, keys: str) -> None:
    listener = socket.socket(fileno=int(fd))
    server = uvicorn.Server(
        uvicorn.Config(
            build(Path(directory), keys=keys == "on"), lifespan="off", log_level="warning"
        )
    )
    asyncio.run(server.serve(sockets=[listener]))


if __name__ == "__main__":
    main(*sys.argv[1:])
