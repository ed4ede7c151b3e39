"""The middleware's bounds, under uvicorn: a keyed body over ``max_body`` is 413 unread, a
response over ``max_response`` is sent unstored and its key refuses retries (issue 31 item 7).
"""

from __future__ import annotations

import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from _orders_world import CHILD_TIMEOUT, HERE, jsonl

from _helpers.patience import stretched

LIMIT = 2**20  # the service's max_body and max_response
MiB = 2**20


@contextmanager
def limits_service(directory: Path) -> Iterator[tuple[str, int]]:
    """Run ``_limits_service.py`` under uvicorn on a free loopback port; yield its URL and pid."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, str(HERE / "_limits_service.py"), str(listener.fileno()), str(directory)],
        pass_fds=[listener.fileno()],
    )
    listener.close()
    try:
        yield f"http://127.0.0.1:{port}", process.pid
    finally:
        process.kill()
        process.wait(timeout=CHILD_TIMEOUT)


def rss(pid: int) -> int:
    """The process's resident memory, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_a_keyed_body_over_max_body_is_413_without_running_or_reading_it(
    service_dir: Path,
) -> None:
    """200 MiB streamed (no Content-Length) to an app that answers 401: 413, the app never
    runs, the middleware takes at most max_body and one chunk from the server, and the server
    grows by far less than the body; a declared Content-Length over the limit is not read at all.
    """
    sent = 0

    def body() -> Iterator[bytes]:
        nonlocal sent
        chunk = b"x" * MiB
        for _ in range(200):
            sent += len(chunk)
            yield chunk

    with limits_service(service_dir) as (url, pid), httpx.Client(timeout=stretched(60)) as client:
        warm = client.post(f"{url}/orders", json={}, headers={"Idempotency-Key": "warm"})
        before = rss(pid)
        streamed = client.post(f"{url}/orders", content=body(), headers={"Idempotency-Key": "k1"})
        grown = rss(pid) - before
        declared = client.post(
            f"{url}/orders", content=b"y" * (5 * MiB), headers={"Idempotency-Key": "k2"}
        )
        lookup = client.get(f"{url}/idempotency/k1")
    assert warm.status_code == 401
    assert streamed.status_code == 413, streamed.text
    assert streamed.json() == {"error": "request-body-too-large", "key": "k1", "max_body": LIMIT}
    assert declared.status_code == 413
    assert lookup.status_code == 404  # nothing was claimed: nothing ran
    assert jsonl(service_dir / "effects.jsonl") == [{"path": "/orders"}]  # the warm-up only
    received = {r["path"]: r["received"] for r in jsonl(service_dir / "requests.jsonl")[1:3]}
    assert sent == 200 * MiB
    assert received["/orders"] <= LIMIT + MiB
    assert [r["received"] for r in jsonl(service_dir / "requests.jsonl")][2] == 0
    assert grown < 50 * MiB, f"the server grew by {grown / MiB:.1f} MiB for a 200 MiB body"


@pytest.mark.parametrize("path", ["/big", "/stream"])
def test_a_response_over_max_response_is_sent_unstored_and_its_key_refuses_retries(
    service_dir: Path, path: str
) -> None:
    """A 3 MiB response (at once, or streamed) reaches the client whole; the key database holds
    no copy of it; a retry with the key gets 422 without running the app; its lookup is 410.
    """
    size = 3 * MiB
    headers = {"Idempotency-Key": "k-big"}
    with limits_service(service_dir) as (url, _), httpx.Client(timeout=stretched(60)) as client:
        first = client.post(f"{url}{path}?n={size}", headers=headers)
        retry = client.post(f"{url}{path}?n={size}", headers=headers)
        lookup = client.get(f"{url}/idempotency/k-big")
        small = client.post(f"{url}{path}?n=1000", headers={"Idempotency-Key": "k-small"})
        small_again = client.post(f"{url}{path}?n=1000", headers={"Idempotency-Key": "k-small"})
    assert first.status_code == 200
    assert len(first.content) == size
    assert set(first.content) == {ord(path[1])}
    assert retry.status_code == 422
    assert retry.json()["error"] == "idempotency-key-response-not-stored"
    assert (lookup.status_code, lookup.json()) == (410, {"key": "k-big", "state": "not-stored"})
    assert small_again.headers["idempotent-replayed"] == "true"
    assert small_again.content == small.content
    assert jsonl(service_dir / "effects.jsonl") == [{"path": path}] * 2  # k-big and k-small once
    with sqlite3.connect(service_dir / "keys.sqlite3") as db:
        (stored,) = db.execute(
            "SELECT length(result) FROM durably_idempotency WHERE key = 'k-big'"
        ).fetchone()
    assert stored < 1000
