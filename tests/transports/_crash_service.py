"""A keyed order service that can be told to hang mid-request, for the receiver crash tests.

Usage: ``python _crash_service.py <listening-socket-fd> <directory> <keys: file|DSN> <on|off>``.

``POST /orders`` behind :class:`IdempotencyMiddleware` (lease 1 s, lookups at
``/idempotency/{key}``) places an order: with keys in ``keys.sqlite3`` (``file``)
or in PostgreSQL (a DSN). With ``on`` the endpoint is transactional: the order is
a row of ``orders`` written through the key's transaction; with ``off`` it is a
line appended to ``effects.jsonl``. While ``<directory>/hang`` exists, the handler
writes ``<directory>/entered`` after its effect and then waits forever, so the
test can SIGKILL the process mid-request.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from datetime import timedelta
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from durably.receivers import (
    IdempotencyMiddleware,
    IdempotencyStore,
    PostgresIdempotencyStore,
    transaction,
)
from durably.receivers._store import KeyStore

LEASE = timedelta(seconds=1)


def main(fd: str, directory: str, keys: str, transactional: str) -> None:
    """Serve until killed."""
    root = Path(directory)
    store: KeyStore
    if keys == "file":
        store = IdempotencyStore(root / "keys.sqlite3", lease=LEASE)
    else:
        store = PostgresIdempotencyStore(keys, lease=LEASE)
    declared = transactional == "on"

    async def place(request: Request) -> Response:
        data = await request.json()
        if declared:
            await transaction().execute("INSERT INTO orders (item) VALUES (%s)", (data["item"],))
        else:
            line = (json.dumps(data) + "\n").encode()
            fd = os.open(root / "effects.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        if (root / "hang").exists():
            (root / "entered").write_text("yes")
            await asyncio.Event().wait()
        return JSONResponse({"placed": data["item"]}, status_code=201)

    app = IdempotencyMiddleware(
        Starlette(routes=[Route("/orders", place, methods=["POST"])]),
        store=store,
        wait=0.0,
        lookup_path="/idempotency",
        transactional=declared,
    )
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning"))
    asyncio.run(server.serve(sockets=[socket.socket(fileno=int(fd))]))


if __name__ == "__main__":
    main(*sys.argv[1:])
