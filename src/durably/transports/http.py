"""HTTP tools: a durably tool that is one request to a service, keyed by the call.

:func:`http_tool` turns an endpoint into a tool. The model's arguments (a
msgspec Struct describes them) go out as the JSON body, or as the query string
for ``GET``. Every call that can change something carries the call's key in the
``Idempotency-Key`` header, on every attempt and in every process, so a service
that honours the header (:class:`durably.receivers.IdempotencyMiddleware` does)
applies a retried call once.

A 2xx answer is the call's result (the response text). A receiver's 409
``idempotency-key-abandoned`` (an earlier request with this key died with its
process and may have acted) raises :class:`~durably.ToolInDoubt`: the call goes
up the resolution ladder, it is not a plain failure. Any other answer raises
:class:`HttpToolError`, which the loop gives the model as an error result.
Retries stay inside one call and only where a repeat is harmless: ``read`` and
``idempotent`` tools retry transport errors and 502/503/504, ``keyed`` tools
also retry a 409 that carries ``Retry-After`` (the service is still working on
the same key); ``write`` tools never retry.

An optional ``lookup_url`` lets the resolution ladder ask the service whether
an in-doubt call happened: ``200`` is found (the body is the call's result),
``404`` is not found, and anything else — a 5xx, a timeout, a redirect, a 410 —
is unknown, never not found.

httpx is imported when a tool first runs, so ``import durably`` stays light.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote

import msgspec

from ..errors import DurablyError
from ..state import Effect
from ..tools import (
    NOT_FOUND,
    UNKNOWN,
    Found,
    KeyLifetime,
    Lookup,
    LookupFunction,
    Tool,
    ToolContext,
    ToolInDoubt,
    _schema,
    checked_key_ttl,
)

if TYPE_CHECKING:
    import httpx

__all__ = ["IDEMPOTENCY_HEADER", "ORIGINAL_STATUS_HEADER", "HttpToolError", "http_tool"]

IDEMPOTENCY_HEADER: Final = "Idempotency-Key"
"""The request header that carries the call's idempotency key."""
ORIGINAL_STATUS_HEADER: Final = "Idempotency-Original-Status"
"""Set by a lookup answer to the status the looked-up call originally got."""

_RETRY_STATUSES: Final = frozenset({502, 503, 504})
_MAX_RETRY_AFTER: Final = 5.0
_BODY_IN_ERROR: Final = 2000


class HttpToolError(DurablyError):
    """Raised by an HTTP tool when the service answers with a non-2xx status or cannot be reached.

    The loop turns it into an error result the model reads; ``status`` is None
    when no answer came back.
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def http_tool(  # noqa: C901, PLR0913 - a tool factory: its options are keyword-only, its checks name each bad one
    *,
    name: str,
    description: str,
    method: str,
    url: str,
    effect: Effect,
    arguments: type[msgspec.Struct],
    needs_approval: bool = False,
    key_ttl: timedelta | KeyLifetime | None = None,
    lookup_url: str | None = None,
    client: httpx.AsyncClient | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 30.0,
    retries: int = 2,
) -> Tool:
    """Declare a tool that sends one HTTP request per call.

    Args:
        name: the tool's name, as the model sees it.
        description: what the model is told the tool does.
        method: the HTTP method (``GET`` sends the arguments as a query string).
        url: the endpoint; ``{field}`` placeholders are filled from the
            arguments (URL-quoted; the arguments are still sent in full), and
            ``{key}`` from the call's key.
        effect: what a call does to the world; there is no default on purpose.
        arguments: a msgspec Struct describing the arguments; it gives the
            model its JSON Schema and validates what the model writes.
        needs_approval: ask the approver before each call.
        key_ttl: how long the service remembers keys: required for ``keyed``
            (a little below the service's own TTL, or ``durably.NEVER_EXPIRES``).
        lookup_url: an endpoint answering whether an in-doubt call happened,
            with the same placeholders as ``url`` (for example
            ``https://api.example/idempotency/{key}``).
        client: the httpx client to send with (default: a new one per call).
        headers: extra headers for every request (authorization, say).
        timeout: seconds for each request.
        retries: extra attempts where a repeat is harmless (never for ``write``).
    """
    if not isinstance(effect, Effect):
        raise TypeError(f"effect must be a durably.Effect, got {effect!r}")
    ttl = checked_key_ttl(effect, key_ttl, name, required=True)
    if lookup_url is not None and effect in (Effect.READ, Effect.IDEMPOTENT):
        raise ValueError(
            f"a {effect} tool is rerun after a crash and never looked up; drop lookup_url"
        )
    if not (isinstance(arguments, type) and issubclass(arguments, msgspec.Struct)):
        raise TypeError(f"arguments must be a msgspec.Struct subclass, got {arguments!r}")
    fields = frozenset(arguments.__struct_fields__)
    _check_template(url, fields, what="url")
    if lookup_url is not None:
        _check_template(lookup_url, fields, what="lookup_url")
    verb = method.upper()
    endpoint = _Endpoint(
        client=client,
        headers=dict(headers or {}),
        timeout=timeout,
    )

    async def call(ctx: ToolContext, **values: Any) -> str:
        body = arguments(**values)
        send_headers = {}
        if effect is not Effect.READ:
            send_headers[IDEMPOTENCY_HEADER] = ctx.idempotency_key
        target = _fill(url, values, ctx.idempotency_key)
        if verb in ("GET", "HEAD"):
            request: dict[str, Any] = {"params": _query(body)}
        else:
            request = {
                "content": msgspec.json.encode(body),
                "headers": {"Content-Type": "application/json"},
            }
        response = await endpoint.send(
            verb,
            target,
            send_headers,
            request,
            attempts=1 + (0 if effect is Effect.WRITE else max(retries, 0)),
            retry_busy=effect is Effect.KEYED,
        )
        if _abandoned(response):
            # The receiver's own word that an earlier request with this key died with
            # its process and may have acted: not a failure, a call in doubt, which the
            # ladder settles (the lookup says "abandoned", then a person decides).
            raise ToolInDoubt(
                f"{_describe(verb, target, response)}. An earlier request with this key "
                "may have acted."
            )
        if not response.is_success:
            raise HttpToolError(_describe(verb, target, response), status=response.status_code)
        return response.text

    lookup: LookupFunction | None = None
    if lookup_url is not None:
        template = lookup_url

        async def look(ctx: ToolContext, **values: Any) -> Lookup:
            target = _fill(template, values, ctx.idempotency_key)
            try:
                response = await endpoint.send(
                    "GET",
                    target,
                    {IDEMPOTENCY_HEADER: ctx.idempotency_key},
                    {},
                    attempts=1,
                    retry_busy=False,
                )
            except (HttpToolError, ToolInDoubt):  # no answer is no knowledge
                return UNKNOWN
            return _lookup_answer(response)

        lookup = look

    return Tool(
        name=name,
        description=description,
        effect=effect,
        function=call,
        arguments=arguments,
        schema=_schema(arguments),
        needs_approval=needs_approval,
        key_ttl=ttl,
        lookup=lookup,
    )


ABANDONED_ERROR: Final = "idempotency-key-abandoned"
"""The ``error`` of a receiver's 409 for a key whose request died with its process."""


def _abandoned(response: httpx.Response) -> bool:
    """Whether ``response`` is a receiver's 409 ``idempotency-key-abandoned``."""
    if response.status_code != 409:
        return False
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("error") == ABANDONED_ERROR


def _lookup_answer(response: httpx.Response) -> Lookup:
    """Read a lookup response: only 200 and 404 decide; everything else is unknown."""
    if response.status_code == 404:
        return NOT_FOUND
    if response.status_code != 200:
        return UNKNOWN
    original = response.headers.get(ORIGINAL_STATUS_HEADER, "")
    if original.isdigit() and not 200 <= int(original) < 300:
        # The call happened and the service refused it; that refusal is its result.
        return Found(f"the service answered {original}: {response.text[:_BODY_IN_ERROR]}")
    return Found(response.text)


class _AskAgain(Exception):
    """An answer that asks for the same request again after ``pause`` seconds (502, a busy 409)."""

    def __init__(self, pause: float) -> None:
        super().__init__(pause)
        self.pause = pause


class _Endpoint:
    """Sends requests with the tool's client, headers, timeout and retry rules."""

    def __init__(
        self, *, client: httpx.AsyncClient | None, headers: dict[str, str], timeout: float
    ) -> None:
        self.client = client
        self.headers = headers
        self.timeout = timeout

    async def send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        request: dict[str, Any],
        *,
        attempts: int,
        retry_busy: bool,
    ) -> httpx.Response:
        import httpx
        import stamina

        merged = {**self.headers, **headers, **request.pop("headers", {})}
        backoff = 0.2
        tried = 0

        def wait_before_next(exc: Exception) -> bool | float:
            # stamina's backoff hook: a float is the wait before the next try, False gives up.
            nonlocal backoff
            if tried >= attempts:
                return False
            if isinstance(exc, _AskAgain):
                pause = exc.pause
            elif isinstance(exc, httpx.TransportError):
                pause = backoff
            else:
                return False
            backoff = min(backoff * 2, _MAX_RETRY_AFTER)
            return pause

        try:
            async for attempt in stamina.retry_context(
                on=wait_before_next, attempts=None, timeout=None
            ):
                with attempt:
                    tried = attempt.num
                    if self.client is not None:
                        response = await self._request(self.client, method, url, merged, request)
                    else:
                        async with httpx.AsyncClient() as client:
                            response = await self._request(client, method, url, merged, request)
                    retry_after = response.headers.get("Retry-After", "")
                    # The middleware's "still working on this key": same key again is harmless.
                    busy = retry_busy and response.status_code == 409 and bool(retry_after)
                    if tried >= attempts or not (busy or response.status_code in _RETRY_STATUSES):
                        return response
                    if retry_after.replace(".", "", 1).isdigit():
                        raise _AskAgain(min(float(retry_after), _MAX_RETRY_AFTER))
                    raise _AskAgain(backoff)
        except httpx.TransportError as exc:
            if not isinstance(exc, _unsent_errors()):
                # Sent, unanswered: it may have acted. The loop keeps the marker
                # and settles the call through the ladder (same key, lookup).
                raise ToolInDoubt(_no_answer(method, url, exc)) from exc
            raise HttpToolError(_no_answer(method, url, exc)) from exc
        raise AssertionError("unreachable: stamina ends with a return or an exception")

    async def _request(
        self,
        client: httpx.AsyncClient,
        method: str,
        url: str,
        headers: dict[str, str],
        request: dict[str, Any],
    ) -> httpx.Response:
        return await client.request(method, url, headers=headers, timeout=self.timeout, **request)


def _no_answer(method: str, url: str, exc: Exception) -> str:
    # Tell the model what is known: a request that was sent may have been applied,
    # so "try again" (a new call, a new key) is not obviously safe.
    sent = not isinstance(exc, _unsent_errors())
    doubt = " It may or may not have been applied." if sent else " It was not sent."
    return f"{method} {url} got no answer ({type(exc).__name__}: {exc}).{doubt}"


def _unsent_errors() -> tuple[type[Exception], ...]:
    import httpx

    return (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol)


def _describe(method: str, url: str, response: httpx.Response) -> str:
    text = response.text
    if len(text) > _BODY_IN_ERROR:
        text = text[:_BODY_IN_ERROR] + "…"
    return f"{method} {url} answered {response.status_code} {response.reason_phrase}: {text}"


def _query(body: msgspec.Struct) -> dict[str, str]:
    """Top-level fields as query parameters: strings as they are, anything else as JSON."""
    encoded = msgspec.to_builtins(body)
    params = {}
    for name, value in encoded.items():
        if value is None:
            continue
        params[name] = value if isinstance(value, str) else msgspec.json.encode(value).decode()
    return params


def _check_template(template: str, fields: frozenset[str], *, what: str) -> None:
    """Fail at declaration time when a placeholder names no argument."""
    for _, field, spec, conversion in string.Formatter().parse(template):
        if field is None:
            continue
        if field == "key" and "key" in fields:
            raise ValueError(
                f"{what} {template!r}: {{key}} is the idempotency key, and an argument is "
                "also called 'key'; rename the argument"
            )
        if field != "key" and field not in fields:
            raise ValueError(
                f"{what} {template!r} has a placeholder {{{field}}} that is neither "
                f"'key' nor an argument ({', '.join(sorted(fields)) or 'none'})"
            )
        if spec or conversion:
            raise ValueError(f"{what} {template!r}: placeholders take no format spec")


def _fill(template: str, values: Mapping[str, Any], key: str) -> str:
    def text(value: Any) -> str:
        if isinstance(value, str):
            return value
        return msgspec.json.encode(value).decode()

    filled = {name: quote(text(value), safe="") for name, value in values.items()}
    filled["key"] = key
    return template.format_map(filled)
