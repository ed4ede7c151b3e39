"""A receiver key whose server died mid-request is settled once its lease lapses, not left
in flight for the TTL: run again where the effect commits with the key, abandoned otherwise.
"""

from __future__ import annotations

import asyncio
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

import httpx
import psycopg
import pytest
from _orders_world import CHILD_TIMEOUT, jsonl

from durably.receivers import IdempotencyStore, KeyState
from durably.receivers._store import Busy, Claimed, StoredResponse

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
