"""Receivers against other clients and other processes: keys scoped by principal, private
files, several services opening one fresh key database (issue 22).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import stat
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import stamina
from mcp.server.mcpserver import Context
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from durably.receivers import IdempotencyMiddleware, IdempotencyStore, _store, deduplicated
from durably.receivers.mcp import META_KEY


def test_a_key_replayed_by_another_principal_is_a_new_request(tmp_path: Path) -> None:
    """Alice's stored response is never replayed to a client without her credentials: the same
    key from anyone else goes through the application (and its authentication) as a new request.
    """
    handled: list[str] = []

    async def orders(request: Request) -> Response:
        who = request.headers.get("authorization")
        if who is None:
            return JSONResponse({"error": "log in"}, status_code=401)
        handled.append(who)
        response = JSONResponse({"order": len(handled), "for": who}, status_code=201)
        response.set_cookie("session", f"secret-of-{who[-5:]}")
        return response

    async def body() -> None:
        store = IdempotencyStore(tmp_path / "keys.sqlite3")
        app = Starlette(routes=[Route("/orders", orders, methods=["POST"])])
        service = IdempotencyMiddleware(app, store=store, lookup_path="/idempotency")
        transport = httpx.ASGITransport(app=service)
        async with httpx.AsyncClient(transport=transport, base_url="http://shop") as client:

            async def post(auth: str | None) -> httpx.Response:
                client.cookies.clear()  # each principal is its own client
                headers = {"Idempotency-Key": "k1"}
                if auth is not None:
                    headers["Authorization"] = auth
                return await client.post("/orders", json={"item": "widget"}, headers=headers)

            alice = await post("Bearer alice")
            anonymous = await post(None)
            bob = await post("Bearer bob-x")
            alice_again = await post("Bearer alice")
            client.cookies.clear()
            looked_up = await client.get("/idempotency/k1")
            looked_up_by_alice = await client.get(
                "/idempotency/k1", headers={"Authorization": "Bearer alice"}
            )
        store.close()
        assert alice.status_code == 201
        assert anonymous.status_code == 401
        assert "set-cookie" not in anonymous.headers
        assert "alice" not in anonymous.text
        assert bob.status_code == 201
        assert bob.json() == {"order": 2, "for": "Bearer bob-x"}
        assert alice_again.headers["idempotent-replayed"] == "true"
        assert alice_again.content == alice.content
        assert handled == ["Bearer alice", "Bearer bob-x"]
        assert looked_up.status_code == 200
        assert looked_up.headers["idempotency-original-status"] == "401"  # its own answer
        assert looked_up_by_alice.content == alice.content

    asyncio.run(body())


def test_an_mcp_key_replayed_by_another_client_is_a_new_call(tmp_path: Path) -> None:
    """The MCP helper scopes keys by the client's credentials: another client's call with the
    same key runs, and never receives the first client's result.
    """
    store = IdempotencyStore(tmp_path / "keys.sqlite3")
    placed: list[str] = []

    async def place(item: str, ctx: Context) -> str:
        placed.append(item)
        return f"order {len(placed)} of {item}"

    tool = deduplicated(store)(place)

    def context(auth: str | None) -> Any:
        headers = {"authorization": auth} if auth else {}
        request = SimpleNamespace(headers=headers)
        return SimpleNamespace(
            request_context=SimpleNamespace(meta={META_KEY: "k1"}, request=request)
        )

    async def body() -> list[str]:
        return [
            await tool("widget", context("Bearer alice")),
            await tool("widget", context("Bearer bob")),
            await tool("widget", context(None)),
            await tool("widget", context("Bearer alice")),
        ]

    results = asyncio.run(body())
    store.close()
    assert results == ["order 1 of widget", "order 2 of widget", "order 3 of widget", results[0]]
    assert len(placed) == 3


def test_the_key_database_is_private_whatever_the_umask(tmp_path: Path) -> None:
    """keys.sqlite3, -wal and -shm are 0600 under umask 000; an old 0644 file is tightened."""
    old = os.umask(0)
    try:
        store = IdempotencyStore(tmp_path / "keys.sqlite3")

        async def use() -> None:
            claim = await store.claim("k1", "f")
            assert not isinstance(claim, str)

        asyncio.run(use())
        names = sorted(p.name for p in tmp_path.iterdir())
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
        store.close()
        legacy = tmp_path / "legacy.sqlite3"
        legacy.touch(mode=0o644)
        IdempotencyStore(legacy).close()
    finally:
        os.umask(old)
    assert names == ["keys.sqlite3", "keys.sqlite3-shm", "keys.sqlite3-wal"]
    assert modes == dict.fromkeys(names, 0o600)
    assert stat.S_IMODE(legacy.stat().st_mode) == 0o600


def _setup_failing(
    monkeypatch: pytest.MonkeyPatch, errors: list[sqlite3.OperationalError]
) -> list[int]:
    """Make the key database's setup raise ``errors`` in turn, then succeed; count the tries."""
    real = IdempotencyStore._set_up  # noqa: SLF001 -- the test makes the setup fail
    tries: list[int] = []

    def set_up(self: IdempotencyStore) -> None:
        tries.append(len(tries) + 1)
        if errors:
            raise errors.pop(0)
        real(self)

    monkeypatch.setattr(IdempotencyStore, "_set_up", set_up)
    return tries


def test_a_busy_key_database_setup_is_tried_again_with_growing_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``database is locked`` while setting up the key database is retried (stamina's policy,
    in its testing mode here) with jittered waits that double from 10 ms, until it succeeds.
    """
    caplog.set_level("INFO", logger="durably.receivers")
    locked = [sqlite3.OperationalError("database is locked") for _ in range(4)]
    tries = _setup_failing(monkeypatch, locked)

    with stamina.set_testing(True, attempts=100, cap=True):
        IdempotencyStore(tmp_path / "keys.sqlite3").close()

    assert tries == [1, 2, 3, 4, 5]
    waits: list[float] = []
    for record in caplog.records:
        if record.name == "durably.receivers":
            assert isinstance(record.args, tuple)
            wait = record.args[-1]
            assert isinstance(wait, float)
            waits.append(wait)
    assert len(waits) == 4
    for wait, ceiling in zip(waits, (0.01, 0.02, 0.04, 0.08), strict=True):
        assert ceiling / 2 <= wait <= ceiling


def test_a_key_database_setup_error_that_is_not_busy_is_raised_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any other SQLite error while setting up the key database is not retried."""
    tries = _setup_failing(monkeypatch, [sqlite3.OperationalError("disk I/O error")])

    with (
        stamina.set_testing(True, attempts=100, cap=True),
        pytest.raises(sqlite3.OperationalError, match="disk I/O error"),
    ):
        IdempotencyStore(tmp_path / "keys.sqlite3")
    assert tries == [1]


def test_a_key_database_locked_past_the_busy_timeout_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the busy timeout is spent, ``database is locked`` reaches the caller."""
    monkeypatch.setattr(_store, "_BUSY_TIMEOUT", 0.0)
    tries = _setup_failing(monkeypatch, [sqlite3.OperationalError("database is locked")])

    with (
        stamina.set_testing(True, attempts=100, cap=True),
        pytest.raises(sqlite3.OperationalError, match="locked"),
    ):
        IdempotencyStore(tmp_path / "keys.sqlite3")
    assert tries == [1]


def test_a_key_database_another_process_is_setting_up_is_waited_for(tmp_path: Path) -> None:
    """Opening a fresh key database while another service holds its first write transaction
    waits and succeeds, though SQLite answers ``database is locked`` at once to the WAL switch.
    """
    path = tmp_path / "keys.sqlite3"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # another service, half-way through its own setup
    other.execute("CREATE TABLE setting_up (x)")
    timer = threading.Timer(0.3, other.execute, ("COMMIT",))
    timer.start()
    started = time.monotonic()
    try:
        IdempotencyStore(path).close()
    finally:
        timer.join()
        other.close()
    assert time.monotonic() - started >= 0.25  # it did wait for the other one
