"""A receiver key whose server died mid-request is settled once its lease lapses, not left
in flight for the TTL: run again where the effect commits with the key, abandoned otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import psycopg
import pytest
from _orders_world import CHILD_TIMEOUT, jsonl
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError

from durably.receivers import (
    IdempotencyStore,
    KeyState,
    PostgresIdempotencyStore,
    deduplicated,
    transaction,
)
from durably.receivers._store import Busy, Claimed, StoredResponse
from durably.receivers.mcp import META_KEY

HERE = Path(__file__).parent
KEY = "7d0f6c2b9a8e4f31b5c4d3e2f1a09876"
ORDER = {"item": "widget"}
BODY = b'{"item": "widget"}'
"""The order's bytes, the same in every attempt (the key's fingerprint covers them)."""
CASES = [
    pytest.param("file", False, id="file"),
    pytest.param("postgres", False, id="postgres", marks=pytest.mark.postgres),
    pytest.param("postgres", True, id="postgres-transactional", marks=pytest.mark.postgres),
]


@contextmanager
def service(
    directory: Path, keys: str, *, transactional: bool
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``_crash_service.py`` on a socket bound here (requests queue until it accepts)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    process = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "_crash_service.py"),
            str(listener.fileno()),
            str(directory),
            keys,
            "on" if transactional else "off",
        ],
        pass_fds=[listener.fileno()],
    )
    listener.close()
    process.args = f"http://127.0.0.1:{port}"  # the URL, for the test
    try:
        yield process
    finally:
        process.kill()
        process.wait(timeout=CHILD_TIMEOUT)


def send_and_leave(url: str) -> socket.socket:
    """Send the keyed order as raw HTTP and do not wait for the answer."""
    body = BODY
    host = url.removeprefix("http://")
    conn = socket.create_connection(tuple(host.split(":")))  # type: ignore[arg-type]
    conn.sendall(
        b"POST /orders HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
        b"Idempotency-Key: %s\r\nContent-Length: %d\r\n\r\n%s"
        % (host.encode(), KEY.encode(), len(body), body)
    )
    return conn


def lookup(url: str) -> httpx.Response:
    """The service's lookup answer for the key."""
    return httpx.get(f"{url}/idempotency/{KEY}", timeout=CHILD_TIMEOUT)


@pytest.mark.parametrize(("keys", "transactional"), CASES)
def test_a_key_whose_server_was_killed_mid_request_is_settled_after_its_lease(
    keys: str, transactional: bool, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A retry after the receiver was SIGKILLed mid-request is run again where the effect is
    transactional with the key (once in all), and otherwise refused with the lookup saying
    abandoned (unknown to the agent), naming the dead owner; never 409-in-flight for the TTL.
    """
    dsn = request.getfixturevalue("pg_dsn") if keys == "postgres" else "file"
    if transactional:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE orders (item text NOT NULL)")
    (tmp_path / "hang").touch()
    with service(tmp_path, dsn, transactional=transactional) as first:
        left = send_and_leave(str(first.args))
        while not (tmp_path / "entered").exists():
            time.sleep(0.02)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=CHILD_TIMEOUT)
        left.close()
    (tmp_path / "hang").unlink()

    with service(tmp_path, dsn, transactional=transactional) as second:
        url = str(second.args)
        while (answer := lookup(url)).status_code == 409:  # in flight until the lease lapses
            assert answer.json()["owner"].endswith(f":{first.pid}")
            time.sleep(0.1)
        state = answer.json()
        retry = httpx.post(
            f"{url}/orders",
            content=BODY,
            headers={"Idempotency-Key": KEY, "Content-Type": "application/json"},
            timeout=CHILD_TIMEOUT,
        )
        after = lookup(url)

    if transactional:
        assert (answer.status_code, state["state"]) == (404, "rolled-back")
        assert (retry.status_code, retry.json()) == (201, {"placed": "widget"})
        assert after.status_code == 200
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT item FROM orders").fetchall() == [("widget",)]
    else:
        assert (answer.status_code, state["state"]) == (410, "abandoned")
        assert state["owner"].endswith(f":{first.pid}")
        assert retry.status_code == 409
        assert "retry-after" not in retry.headers
        assert retry.json()["error"] == "idempotency-key-abandoned"
        assert (after.status_code, after.json()["state"]) == (410, "abandoned")
        assert jsonl(tmp_path / "effects.jsonl") == [ORDER]  # the dead request's, only


def test_a_renewed_lease_keeps_a_live_request_in_flight(tmp_path: Path) -> None:
    """A request that renews its lease stays in flight past the first lease; unrenewed, the
    same key is abandoned, and its owner's late result still lands.
    """
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    store = IdempotencyStore(
        tmp_path / "keys.sqlite3", lease=timedelta(seconds=30), clock=lambda: now[0]
    )

    async def body() -> list[KeyState]:
        claim = await store.claim(KEY, "f")
        assert isinstance(claim, Claimed)
        states = []
        now[0] += timedelta(seconds=20)
        assert await store.renew(claim)
        now[0] += timedelta(seconds=20)
        states.append((await store.record(KEY)).state)
        now[0] += timedelta(seconds=20)
        states.append((await store.record(KEY)).state)
        assert type(await store.claim(KEY, "f")).__name__ == "Abandoned"
        assert await store.finish(claim, _done())
        states.append((await store.record(KEY)).state)
        return states

    try:
        assert asyncio.run(body()) == [KeyState.IN_FLIGHT, KeyState.ABANDONED, KeyState.DONE]
    finally:
        store.close()


def test_a_format_2_running_key_stays_in_flight_until_its_ttl(tmp_path: Path) -> None:
    """A running key written before leases (format 2, no owner) is read, in flight until its
    TTL as before (nothing says its process died), then expired; the file moves to format 3.
    """
    path = tmp_path / "keys.sqlite3"
    old = sqlite3.connect(path)
    old.executescript(
        "CREATE TABLE durably_idempotency (principal TEXT NOT NULL, key TEXT NOT NULL,"
        " fingerprint TEXT NOT NULL, token TEXT NOT NULL, state TEXT NOT NULL,"
        " started_at REAL NOT NULL, finished_at REAL, result BLOB,"
        " PRIMARY KEY (principal, key)) WITHOUT ROWID; PRAGMA user_version = 2;"
    )
    started = datetime(2026, 1, 1, tzinfo=UTC)
    old.execute(
        "INSERT INTO durably_idempotency VALUES ('', ?, 'f', 't', 'running', ?, NULL, NULL)",
        (KEY, started.timestamp()),
    )
    old.commit()
    old.close()
    path.chmod(0o600)
    now = [started + timedelta(hours=23)]
    store = IdempotencyStore(path, clock=lambda: now[0])

    async def body() -> list[object]:
        seen: list[object] = [(await store.record(KEY)).state, type(await store.claim(KEY, "f"))]
        now[0] = started + timedelta(hours=25)
        seen.append((await store.record(KEY)).state)
        return seen

    try:
        assert asyncio.run(body()) == [KeyState.IN_FLIGHT, type(Busy()), KeyState.EXPIRED]
    finally:
        store.close()
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone() == (3,)


def _done() -> StoredResponse:
    return StoredResponse(status=201, headers=[], body=b"{}")


@pytest.mark.postgres
def test_a_stalled_transactional_owner_loses_its_key_and_its_effect(pg_dsn: str) -> None:
    """A transactional request stalled past its lease is taken over by the retry: the retry's
    effect and result commit, the stalled one's finish fails and its effect rolls back.
    """
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (who text NOT NULL)")

    async def body() -> tuple[bool, bool, KeyState]:
        async with PostgresIdempotencyStore(
            pg_dsn, lease=timedelta(seconds=30), clock=lambda: now[0]
        ) as store:
            stalled = await store.claim(KEY, "f", transactional=True)
            assert isinstance(stalled, Claimed)
            async with store.effect(stalled) as first:
                await transaction().execute("INSERT INTO orders VALUES ('stalled')")
                now[0] += timedelta(seconds=31)  # its lease lapses while it stalls
                retry = await store.claim(KEY, "f", transactional=True)
                assert isinstance(retry, Claimed)
                async with store.effect(retry) as second:
                    await transaction().execute("INSERT INTO orders VALUES ('retry')")
                    retried = await second.finish(_done())
                late = await first.finish(_done())
            return retried, late, (await store.record(KEY)).state

    assert asyncio.run(body()) == (True, False, KeyState.DONE)
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT who FROM orders").fetchall() == [("retry",)]


@pytest.mark.postgres
def test_a_postgres_key_replays_refuses_a_changed_request_and_waits_out_a_live_lease(
    pg_dsn: str,
) -> None:
    """The Postgres key store follows the file store's rules: a finished key replays, another
    request under it is a mismatch, a live lease is busy, and an abandoned key stays refused.
    """
    now = [datetime(2026, 1, 1, tzinfo=UTC)]

    async def body() -> list[str]:
        async with PostgresIdempotencyStore(
            pg_dsn, lease=timedelta(seconds=30), clock=lambda: now[0]
        ) as store:
            first = await store.claim(KEY, "f")
            assert isinstance(first, Claimed)
            seen = [type(await store.claim(KEY, "f")).__name__]
            assert await store.finish(first, _done())
            seen += [type(await store.claim(KEY, "f")).__name__]
            seen += [type(await store.claim(KEY, "g")).__name__]
            other = await store.claim("another-key", "f")
            assert isinstance(other, Claimed)
            now[0] += timedelta(seconds=31)
            seen += [type(await store.claim("another-key", "f")).__name__]
            seen += [(await store.record("another-key")).state.value]
            return seen

    assert asyncio.run(body()) == ["Busy", "Replay", "Mismatch", "Abandoned", "abandoned"]


def test_an_mcp_call_whose_first_call_died_is_refused_not_run_again(tmp_path: Path) -> None:
    """A deduplicated MCP tool call whose first call with the key never finished (its holder
    gone, its lease lapsed) is an error saying it may have acted; the tool does not run again.
    """
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    store = IdempotencyStore(tmp_path / "keys.sqlite3", clock=lambda: now[0])
    ran: list[str] = []
    entered, hang = asyncio.Event(), asyncio.Event()

    async def place(item: str, ctx: Context) -> str:
        ran.append(item)
        entered.set()
        await hang.wait()
        return "placed"

    tool = deduplicated(store)(place)
    ctx: Any = SimpleNamespace(request_context=SimpleNamespace(meta={META_KEY: KEY}))

    async def body() -> str:
        first = asyncio.create_task(tool("widget", ctx))
        await entered.wait()
        first.cancel()  # its holder is gone without a result, as a killed server's
        with contextlib.suppress(asyncio.CancelledError):
            await first
        now[0] += store.lease + timedelta(seconds=1)
        with pytest.raises(ToolError) as refused:
            await tool("widget", ctx)
        return str(refused.value)

    try:
        said = asyncio.run(body())
    finally:
        store.close()
    assert "died with its server process" in said
    assert ran == ["widget"]


@pytest.mark.postgres
def test_a_stalled_transactional_request_answers_409_after_its_retry_took_the_key(
    pg_dsn: str,
) -> None:
    """Through the middleware: a transactional request stalled past its lease loses its key to
    the retry, which runs and answers 201; the stalled one then answers 409, its order undone.
    """
    import httpx
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from durably.receivers import IdempotencyMiddleware

    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (who text NOT NULL)")

    async def body() -> tuple[int, int, dict[str, Any]]:
        entered, release = asyncio.Event(), asyncio.Event()

        async def place(request: Request) -> Response:
            who = request.headers["x-who"]
            await transaction().execute("INSERT INTO orders VALUES (%s)", (who,))
            if who == "stalled":
                entered.set()
                await release.wait()
            return JSONResponse({"placed": who}, status_code=201)

        async with PostgresIdempotencyStore(
            pg_dsn, lease=timedelta(seconds=30), clock=lambda: now[0]
        ) as store:
            app = IdempotencyMiddleware(
                Starlette(routes=[Route("/orders", place, methods=["POST"])]),
                store=store,
                wait=0.0,
                transactional=True,
            )
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://shop") as client:

                async def post(who: str) -> httpx.Response:
                    headers = {"Idempotency-Key": KEY, "X-Who": who}
                    return await client.post("/orders", content=BODY, headers=headers)

                stalled = asyncio.create_task(post("stalled"))
                await entered.wait()
                now[0] += timedelta(seconds=31)
                retry = await post("retry")
                release.set()
                late = await stalled
        return retry.status_code, late.status_code, late.json()

    retry, late, said = asyncio.run(body())
    assert (retry, late, said["error"]) == (201, 409, "idempotency-key-in-flight")
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT who FROM orders").fetchall() == [("retry",)]
