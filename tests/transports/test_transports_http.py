"""HTTP tools send the call's key on every attempt and read lookups without ever guessing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from durably import (
    NOT_FOUND,
    UNKNOWN,
    Effect,
    Found,
    Lookup,
    Tool,
    ToolContext,
    ToolInDoubt,
    idempotency_key,
)
from durably.receivers import IdempotencyMiddleware, IdempotencyStore
from durably.state import utcnow
from durably.transports import HttpToolError, http_tool

KEY = idempotency_key("run-1", "c1")
CTX = ToolContext(run_id="run-1", call_id="c1", idempotency_key=KEY, workspace=None, clock=utcnow)


class Order(msgspec.Struct, forbid_unknown_fields=True):
    """An order as the model writes it."""

    item: str
    quantity: int = 1


Handler = Callable[[httpx.Request], httpx.Response]


def tool_with(handler: Handler, effect: Effect, **options: Any) -> tuple[Tool, list[httpx.Request]]:
    """An order tool talking to ``handler``, and the list of requests it receives."""
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    client = httpx.AsyncClient(transport=httpx.MockTransport(record))
    options.setdefault("method", "POST")
    options.setdefault("url", "http://shop/orders")
    options.setdefault("key_ttl", timedelta(hours=23) if effect is Effect.KEYED else None)
    tool = http_tool(
        name="place_order",
        description="Place an order.",
        effect=effect,
        arguments=Order,
        client=client,
        **options,
    )
    return tool, seen


def call(tool: Tool, raw: str = '{"item": "widget", "quantity": 2}') -> str:
    """Call ``tool`` with ``raw`` JSON arguments, as the loop does."""
    return asyncio.run(tool(CTX, **tool.parse(raw)))


def replies(*responses: httpx.Response) -> Handler:
    """A handler answering with ``responses`` in turn."""
    queue = list(responses)
    return lambda request: queue.pop(0)


@pytest.mark.parametrize("effect", [Effect.KEYED, Effect.IDEMPOTENT])
def test_the_key_header_goes_on_every_attempt_with_the_same_body(effect: Effect) -> None:
    """A retried call sends the same Idempotency-Key and the model's arguments as JSON each time."""
    tool, seen = tool_with(
        replies(httpx.Response(503), httpx.Response(201, json={"order": 1})), effect
    )
    assert call(tool) == '{"order":1}'
    assert [r.headers["Idempotency-Key"] for r in seen] == [KEY, KEY]
    assert [json.loads(r.content) for r in seen] == [{"item": "widget", "quantity": 2}] * 2
    assert seen[0].headers["Content-Type"] == "application/json"


def test_write_calls_send_the_key_but_never_retry() -> None:
    """A write tool sends its key once and reports a 503 instead of trying again."""
    tool, seen = tool_with(replies(httpx.Response(503, text="overloaded")), Effect.WRITE)
    with pytest.raises(HttpToolError, match="503") as caught:
        call(tool)
    assert caught.value.status == 503
    assert [r.headers["Idempotency-Key"] for r in seen] == [KEY]


def test_read_calls_send_no_key_and_get_puts_arguments_in_the_query() -> None:
    """A read over GET carries the arguments in the query string and no key."""
    tool, seen = tool_with(
        replies(httpx.Response(200, text="12 in stock")),
        Effect.READ,
        method="GET",
        url="http://shop/stock/{item}",
    )
    assert call(tool) == "12 in stock"
    assert "Idempotency-Key" not in seen[0].headers
    assert seen[0].url.path == "/stock/widget"
    assert dict(seen[0].url.params) == {"item": "widget", "quantity": "2"}


def test_a_keyed_call_retries_the_middlewares_in_flight_409() -> None:
    """A 409 with Retry-After (the same key still running) is retried; the second answer counts."""
    busy = httpx.Response(409, headers={"Retry-After": "0"}, json={"error": "in flight"})
    tool, seen = tool_with(replies(busy, httpx.Response(201, text="order 1")), Effect.KEYED)
    assert call(tool) == "order 1"
    assert len(seen) == 2


def test_an_error_answer_reaches_the_model_with_status_and_body() -> None:
    """A 4xx answer raises HttpToolError naming the status and quoting the body."""
    tool, _ = tool_with(replies(httpx.Response(402, text="card declined")), Effect.KEYED)
    with pytest.raises(HttpToolError, match="402 Payment Required: card declined"):
        call(tool)


def timeout(request: httpx.Request) -> httpx.Response:
    """A handler whose service never answers in time."""
    raise httpx.ReadTimeout("slow", request=request)


@pytest.mark.parametrize(
    ("handler", "expected"),
    [
        (replies(httpx.Response(200, text="order 1")), Found("order 1")),
        (replies(httpx.Response(404)), NOT_FOUND),
        (replies(httpx.Response(410)), UNKNOWN),
        (replies(httpx.Response(500)), UNKNOWN),
        (replies(httpx.Response(409)), UNKNOWN),
        (replies(httpx.Response(302, headers={"Location": "/login"})), UNKNOWN),
        (timeout, UNKNOWN),
    ],
    ids=["200-found", "404-not-found", "410", "500", "409", "302", "timeout"],
)
def test_only_200_and_404_decide_a_lookup(handler: Handler, expected: Any) -> None:
    """A lookup answers found on 200 and not found on 404; anything else is unknown."""
    tool, seen = tool_with(handler, Effect.WRITE, lookup_url="http://shop/lookup/{key}")
    lookup = tool.lookup
    assert lookup is not None

    async def ask() -> Lookup:
        return await lookup(CTX, **tool.parse('{"item": "widget"}'))

    answer = asyncio.run(ask())
    assert answer == expected
    assert seen[0].url.path == f"/lookup/{KEY}"


def test_the_middlewares_lookup_answers_with_the_calls_own_result(tmp_path: Path) -> None:
    """Against the real middleware, a repeat is replayed and the lookup finds the same result."""
    handled = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        handled.append(scope["path"])
        body = b'{"order": 1}'
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": body})

    async def scenario() -> tuple[str, str, Any]:
        store = IdempotencyStore(tmp_path / "keys.sqlite3")
        service = IdempotencyMiddleware(app, store=store, lookup_path="/idempotency")
        transport = httpx.ASGITransport(app=service)
        async with httpx.AsyncClient(transport=transport) as client:
            tool = http_tool(
                name="place_order",
                description="Place an order.",
                method="POST",
                url="http://shop/orders",
                effect=Effect.KEYED,
                arguments=Order,
                key_ttl=timedelta(hours=23),
                lookup_url="http://shop/idempotency/{key}",
                client=client,
            )
            arguments = tool.parse('{"item": "widget"}')
            first = await tool(CTX, **arguments)
            again = await tool(CTX, **arguments)
            assert tool.lookup is not None
            found = await tool.lookup(CTX, **arguments)
        store.close()
        return first, again, found

    first, again, found = asyncio.run(scenario())
    assert first == again == '{"order": 1}'
    assert found == Found(first)
    assert handled == ["/orders"]


def test_declarations_that_cannot_be_honoured_fail_at_once() -> None:
    """key_ttl without keys, a lookup the ladder never asks, or a stray placeholder are errors."""
    base: dict[str, Any] = {
        "name": "t",
        "description": "d",
        "method": "POST",
        "url": "http://shop/orders",
        "arguments": Order,
    }
    with pytest.raises(ValueError, match="key_ttl"):
        http_tool(**base, effect=Effect.WRITE, key_ttl=timedelta(hours=1))
    with pytest.raises(ValueError, match="never looked up"):
        http_tool(**base, effect=Effect.READ, lookup_url="http://shop/{key}")
    with pytest.raises(ValueError, match="placeholder"):
        http_tool(**{**base, "url": "http://shop/{sku}"}, effect=Effect.WRITE)
    with pytest.raises(TypeError, match="Effect"):
        http_tool(**base, effect="write")  # type: ignore[arg-type]


def test_a_sent_request_with_no_answer_is_in_doubt_not_an_error() -> None:
    """A write whose request was sent but never answered raises ToolInDoubt for the ladder."""

    def silent(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("no answer", request=request)

    tool, seen = tool_with(silent, Effect.WRITE)
    with pytest.raises(ToolInDoubt, match="may or may not have been applied"):
        call(tool)
    assert len(seen) == 1  # a write is never retried blindly


def test_a_request_that_was_never_sent_is_a_plain_error() -> None:
    """A connection refused before sending is an ordinary error: nothing can have acted."""

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    tool, _ = tool_with(refused, Effect.WRITE)
    with pytest.raises(HttpToolError, match="was not sent"):
        call(tool)


def test_a_receivers_abandoned_409_is_in_doubt_not_a_failure() -> None:
    """A 409 idempotency-key-abandoned (the key's earlier request died) raises ToolInDoubt."""
    abandoned = httpx.Response(
        409, json={"error": "idempotency-key-abandoned", "key": KEY, "owner": "host:1"}
    )
    tool, seen = tool_with(replies(abandoned), Effect.KEYED)
    with pytest.raises(ToolInDoubt, match="may have acted"):
        call(tool)
    assert len(seen) == 1  # no Retry-After: not retried blindly
