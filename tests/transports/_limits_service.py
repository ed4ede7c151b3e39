"""A service for the limits tests, run by uvicorn in a process of its own (issue 31 item 7).

Usage: ``python _limits_service.py <listening-socket-fd> <directory>``.

Behind :class:`IdempotencyMiddleware` with ``max_body`` and ``max_response`` of
1 MiB: ``POST /orders`` answers 401 (an app that never wanted the body),
``POST /big?n=N`` answers N bytes at once and ``POST /stream?n=N`` streams
them in 64 KiB chunks. Each app run appends a line to ``effects.jsonl``; each
request appends to ``requests.jsonl`` how many body bytes the middleware took
from the server.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import uvicorn
from _orders_service import append
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from durably.receivers import IdempotencyMiddleware, IdempotencyStore
from durably.receivers.asgi import ASGIApp, Message, Receive, Scope, Send

LIMIT = 2**20
CHUNK = 64 * 2**10


def build(directory: Path) -> ASGIApp:
    """The service's ASGI app."""
    effects = directory / "effects.jsonl"

    async def orders(request: Request) -> Response:
        append(effects, {"path": "/orders"})
        return JSONResponse({"error": "log in"}, status_code=401)

    async def big(request: Request) -> Response:
        append(effects, {"path": "/big"})
        return Response(b"b" * int(request.query_params["n"]), media_type="text/plain")

    async def stream(request: Request) -> Response:
        append(effects, {"path": "/stream"})
        size = int(request.query_params["n"])

        async def chunks() -> AsyncIterator[bytes]:
            for start in range(0, size, CHUNK):
                yield b"s" * min(CHUNK, size - start)

        return StreamingResponse(chunks(), media_type="text/plain")

    app = Starlette(
        routes=[
            Route("/orders", orders, methods=["POST"]),
            Route("/big", big, methods=["POST"]),
            Route("/stream", stream, methods=["POST"]),
        ]
    )
    store = IdempotencyStore(directory / "keys.sqlite3")
    keyed = IdempotencyMiddleware(
        app, store=store, lookup_path="/idempotency", max_body=LIMIT, max_response=LIMIT
    )

    async def counted(scope: Scope, receive: Receive, send: Send) -> None:
        received = 0

        async def counting() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            return message

        try:
            await keyed(scope, counting, send)
        finally:
            if scope["type"] == "http":
                append(directory / "requests.jsonl", {"path": scope["path"], "received": received})

    return counted


def main(fd: str, directory: str) -> None:
    listener = socket.socket(fileno=int(fd))
    server = uvicorn.Server(
        uvicorn.Config(build(Path(directory)), lifespan="off", log_level="warning")
    )
    asyncio.run(server.serve(sockets=[listener]))


if __name__ == "__main__":
    main(*sys.argv[1:])
