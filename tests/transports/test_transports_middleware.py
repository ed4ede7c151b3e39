"""The receiver's middleware gives a service Stripe's Idempotency-Key semantics, across restarts."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from _orders_world import jsonl, order_service
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from _helpers.patience import stretched
from durably.receivers import IdempotencyMiddleware, IdempotencyStore

KEY = "4f1c2a7be9d04c33a1b2c3d4e5f60718"
WIDGETS = {"item": "widget", "quantity": 2}


@dataclass
class Clock:
    """A clock the test moves by hand."""

    now: datetime = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        """The clock's current time."""
        return self.now


class WatchedStore(IdempotencyStore):
    """A store that records each claim's outcome, so a test can see a duplicate waiting."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.claims: list[str] = []
        self.busy = threading.Event()

    def _claim(self, key: str, fingerprint: str, principal: str = "") -> Any:
        outcome = super()._claim(key, fingerprint, principal)
        self.claims.append(type(outcome).__name__)
        if self.claims[-1] == "Busy":
            self.busy.set()
        return outcome


@dataclass
class Shop:
    """An in-process order app behind the middleware, counting what its handler did."""

    client: httpx.AsyncClient
    store: WatchedStore
    handled: list[dict[str, Any]] = field(default_factory=list)
    entered: asyncio.Event = field(default_factory=asyncio.Event)
    gate: asyncio.Event | None = None

    async def post(
        self, body: Any, *, key: str | None = KEY, path: str = "/orders"
    ) -> httpx.Response:
        """Post ``body`` to the shop with the idempotency key ``key``."""
        headers = {"Idempotency-Key": key} if key is not None else {}
        return await self.client.post(path, json=body, headers=headers)


@asynccontextmanager
async def shop(
    tmp_path: Path, *, clock: Clock | None = None, wait: float = 10.0, gated: bool = False
) -> AsyncIterator[Shop]:
    """A fresh shop whose keys live in ``tmp_path/keys.sqlite3``."""
    store = WatchedStore(tmp_path / "keys.sqlite3", ttl=timedelta(hours=1), clock=clock or Clock())
    gate = asyncio.Event() if gated else None

    async def orders(request: Request) -> Response:
        data = await request.json()
        state.handled.append(data)
        state.entered.set()
        if state.gate is not None:
            await state.gate.wait()
        if data["item"] == "unobtainium":
            return JSONResponse({"error": "out of stock"}, status_code=409)
        if data["item"] == "bug":
            raise RuntimeError("the handler crashed")
        return JSONResponse({"order": len(state.handled), **data}, status_code=201)

    app = Starlette(routes=[Route("/orders", orders, methods=["POST", "GET"])])
    middleware = IdempotencyMiddleware(app, store=store, wait=wait, lookup_path="/idempotency")
    transport = httpx.ASGITransport(app=middleware, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://shop") as client:
        state = Shop(client=client, store=store, gate=gate)
        try:
            yield state
        finally:
            store.close()


def scenario(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run the async ``body`` to its end."""
    asyncio.run(body())


def test_a_repeated_key_gets_the_first_response_and_the_handler_runs_once(tmp_path: Path) -> None:
    """The second request with a key gets the stored status, headers and body, marked replayed."""

    async def body() -> None:
        async with shop(tmp_path) as s:
            first = await s.post(WIDGETS)
            second = await s.post(WIDGETS)
            assert len(s.handled) == 1
            assert (second.status_code, second.content) == (201, first.content)
            assert second.headers["content-type"] == first.headers["content-type"]
            assert "idempotent-replayed" not in first.headers
            assert second.headers["idempotent-replayed"] == "true"

    scenario(body)


def test_error_responses_are_stored_and_replayed_too(tmp_path: Path) -> None:
    """A 4xx answer and a crashed handler's 500 are replayed for their key, never rerun."""

    async def body() -> None:
        async with shop(tmp_path) as s:
            refused = [await s.post({"item": "unobtainium"}) for _ in range(2)]
            crashed = [await s.post({"item": "bug"}, key="k-bug") for _ in range(2)]
            assert [r.status_code for r in refused] == [409, 409]
            assert refused[1].json() == {"error": "out of stock"}
            assert refused[1].headers["idempotent-replayed"] == "true"
            assert [r.status_code for r in crashed] == [500, 500]
            assert crashed[1].headers["idempotent-replayed"] == "true"
            assert [d["item"] for d in s.handled] == ["unobtainium", "bug"]

    scenario(body)


def test_a_key_reused_with_other_parameters_gets_422(tmp_path: Path) -> None:
    """The same key with a different body, path or method is refused, and nothing runs."""

    async def body() -> None:
        async with shop(tmp_path) as s:
            await s.post(WIDGETS)
            other_body = await s.post({**WIDGETS, "quantity": 3})
            other_path = await s.post(WIDGETS, path="/orders?rush=1")
            other_method = await s.client.put(
                "/orders", json=WIDGETS, headers={"Idempotency-Key": KEY}
            )
            assert [r.status_code for r in (other_body, other_path, other_method)] == [422] * 3
            assert other_body.json()["error"] == "idempotency-key-reused"
            assert len(s.handled) == 1

    scenario(body)


def test_a_concurrent_duplicate_waits_for_the_first_and_gets_its_response(tmp_path: Path) -> None:
    """A duplicate arriving while the first is in flight waits, then gets the first's response."""

    async def body() -> None:
        async with shop(tmp_path, gated=True) as s:
            assert s.gate is not None
            first = asyncio.create_task(s.post(WIDGETS))
            await s.entered.wait()
            second = asyncio.create_task(s.post(WIDGETS))
            assert await asyncio.to_thread(s.store.busy.wait, 5)
            s.gate.set()
            one, two = await first, await second
            assert (one.status_code, two.status_code) == (201, 201)
            assert two.content == one.content
            assert two.headers["idempotent-replayed"] == "true"
            assert s.store.claims[-1] == "Replay"
            assert len(s.handled) == 1

    scenario(body)


def test_a_concurrent_duplicate_past_the_wait_gets_409_with_retry_after(tmp_path: Path) -> None:
    """With no wait, a duplicate of an in-flight request gets 409 and Retry-After at once."""

    async def body() -> None:
        async with shop(tmp_path, gated=True, wait=0.0) as s:
            assert s.gate is not None
            first = asyncio.create_task(s.post(WIDGETS))
            await s.entered.wait()
            busy = await s.post(WIDGETS)
            lookup = await s.client.get(f"/idempotency/{KEY}")
            s.gate.set()
            assert (await first).status_code == 201
            assert busy.status_code == 409
            assert busy.headers["retry-after"] == "1"
            assert busy.json()["error"] == "idempotency-key-in-flight"
            assert lookup.status_code == 409
            assert len(s.handled) == 1

    scenario(body)


def test_a_key_older_than_the_ttl_counts_as_new(tmp_path: Path) -> None:
    """Once the clock passes the TTL the key is forgotten: its lookup says 410 and it runs again."""

    async def body() -> None:
        clock = Clock()
        async with shop(tmp_path, clock=clock) as s:
            first = await s.post(WIDGETS)
            clock.now += timedelta(minutes=59)
            assert (await s.post(WIDGETS)).headers["idempotent-replayed"] == "true"
            clock.now += timedelta(minutes=2)
            forgotten = await s.client.get(f"/idempotency/{KEY}")
            again = await s.post(WIDGETS)
            assert forgotten.status_code == 410
            assert forgotten.json() == {"key": KEY, "state": "expired"}
            assert again.status_code == 201
            assert "idempotent-replayed" not in again.headers
            assert again.json()["order"] == 2
            assert first.json()["order"] == 1
            assert len(s.handled) == 2

    scenario(body)


def test_the_lookup_tells_done_from_never_seen(tmp_path: Path) -> None:
    """A processed key answers 200 with its original body and status; an unseen key answers 404."""

    async def body() -> None:
        async with shop(tmp_path) as s:
            placed = await s.post(WIDGETS)
            done = await s.client.get(f"/idempotency/{KEY}")
            unseen = await s.client.get("/idempotency/never-sent")
            invalid = await s.client.get("/idempotency/")
            assert done.status_code == 200
            assert done.content == placed.content
            assert done.headers["idempotency-original-status"] == "201"
            assert unseen.status_code == 404
            assert unseen.json() == {"key": "never-sent", "state": "unknown"}
            assert invalid.status_code == 400

    scenario(body)


def test_requests_without_a_key_or_with_a_safe_method_pass_through(tmp_path: Path) -> None:
    """No key, or a GET with a key, reaches the app every time and leaves nothing stored."""

    async def body() -> None:
        async with shop(tmp_path) as s:
            await s.post(WIDGETS, key=None)
            await s.post(WIDGETS, key=None)
            read = await s.client.request(
                "GET", "/orders", content=json.dumps(WIDGETS), headers={"Idempotency-Key": KEY}
            )
            bad = await s.post(WIDGETS, key="has space")
            assert read.status_code == 201
            assert bad.status_code == 400
            assert len(s.handled) == 3
            assert (await s.client.get(f"/idempotency/{KEY}")).status_code == 404

    scenario(body)


def test_keys_survive_a_killed_and_restarted_service(service_dir: Path) -> None:
    """A response stored before the service process was SIGKILLed is replayed by its successor."""
    order = {"item": "widget", "quantity": 2, "reference": "po-17"}
    headers = {"Idempotency-Key": KEY}
    with order_service(service_dir, keys=True) as (url, process):
        first = httpx.post(f"{url}/orders", json=order, headers=headers, timeout=stretched(30))
        process.kill()
    with order_service(service_dir, keys=True) as (url, _):
        second = httpx.post(f"{url}/orders", json=order, headers=headers, timeout=stretched(30))
    assert first.status_code == 201
    assert (second.status_code, second.content) == (201, first.content)
    assert second.headers["idempotent-replayed"] == "true"
    assert len(jsonl(service_dir / "effects.jsonl")) == 1
