"""An ASGI middleware giving any ASGI service Stripe's ``Idempotency-Key`` semantics.

Wrap the application once::

    store = IdempotencyStore("idempotency.sqlite3", ttl=timedelta(hours=24))
    app = IdempotencyMiddleware(app, store=store)

For a request whose method is in ``methods`` (POST, PUT, PATCH, DELETE) and that
carries an ``Idempotency-Key`` header:

- the first request with the key runs; its response — status, headers and body,
  errors included (a 4xx, a 5xx, an exception becomes a stored 500) — is written
  durably *before* it is sent, then sent;
- a later request with the key and the same method, path, query and body gets
  the stored response again, with ``Idempotent-Replayed: true``; the
  application does not see it;
- the same key with a different method, path, query or body gets ``422``;
- a request with the key while the first is still running waits up to ``wait``
  seconds for it to finish and then gets its response; if it is still running
  then, ``409`` with ``Retry-After`` (durably's HTTP tools retry it);
- a key older than the store's TTL counts as new.

Keys are scoped by principal, as Stripe scopes them by account: by default the
principal is the request's ``Authorization`` header, or its cookies when it has
none (hashed; neither is stored), so the same key sent by another client, or with no
credentials, is a *different key*: it runs as a new request (through the
application and its authentication) and never receives another principal's
stored response. Pass ``principal=`` to name the principal yourself (an account
ID from your authentication) when a client's credentials change between its
retries (rotating tokens or session cookies): a retry whose principal changed
is a new request, and would run again.

Requests without the header, other methods and other protocols (websocket,
lifespan) pass through untouched.

Bodies are bounded. A keyed request's body is read before the application
runs, up to ``max_body`` bytes (default 10 MiB): a longer one (declared or
sent) gets ``413`` at once, its rest unread, and nothing is claimed. A keyed
response is buffered up to ``max_response`` bytes (default 10 MiB), stored,
then sent; a longer one, streaming or not, is sent through unstored, and its
key is first marked so: a retry with it gets ``422``
(``idempotency-key-response-not-stored``), never a second run, and its lookup
``410`` (state ``not-stored``).

A keyed request holds its key with a lease, renewed while it runs. If the
*service* dies mid-request, the key is settled once the lease lapses (the
store's ``lease``, 30 s by default), never left in flight for the TTL:

- on an endpoint declared ``transactional`` (a
  :class:`~durably.receivers.postgres.PostgresIdempotencyStore`, the effect
  written through :func:`~durably.receivers.postgres.transaction`), the effect
  and the stored response are one commit, so the dead request's effect rolled
  back with it: a retry with the key runs again;
- anywhere else the effect and the stored response are two commits, and the dead
  request may have acted: a retry gets ``409`` without ``Retry-After``
  (``idempotency-key-abandoned``), and the lookup ``410`` (state ``abandoned``),
  which an agent reads as unknown and passes to a person. Nothing guesses.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Collection, MutableMapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Final

import msgspec

from ..transports.http import IDEMPOTENCY_HEADER
from ._keys import (
    Abandoned,
    Busy,
    Claimed,
    KeyStore,
    Mismatch,
    Replay,
    Stored,
    StoredResponse,
    Unstored,
    principal_digest,
    renewing,
    valid_key,
)
from .lookup import http_answer, lookup

__all__ = [
    "REPLAYED_HEADER",
    "ASGIApp",
    "IdempotencyMiddleware",
    "LookupApp",
    "Principal",
    "credentials_principal",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Principal = Callable[[Scope], str | bytes | None]
"""Who sent a request (None: nobody in particular); hashed before it is stored."""

DEFAULT_MAX_BODY: Final = 10 * 2**20
"""The longest keyed request body the middleware reads by default (10 MiB)."""
DEFAULT_MAX_RESPONSE: Final = 10 * 2**20
"""The longest keyed response the middleware stores by default (10 MiB)."""

REPLAYED_HEADER: Final = "Idempotent-Replayed"
"""Set to ``true`` on a response replayed from the store."""

_HEADER: Final = IDEMPOTENCY_HEADER.lower().encode("latin-1")
_CREDENTIALS: Final = (b"authorization", b"cookie")
# Per-connection or per-moment headers: a replay gets fresh ones from the server.
_NOT_STORED: Final = frozenset({"date", "server", "connection", "keep-alive", "transfer-encoding"})
_TAKEN_OVER: Final = {
    "error": "idempotency-key-in-flight",
    "detail": "this request stalled past its lease and a retry with the key took it over; "
    "its effect was rolled back",
}
_CRASHED: Final = StoredResponse(
    status=500,
    headers=[("content-type", "text/plain; charset=utf-8"), ("content-length", "21")],
    body=b"Internal Server Error",
)


class IdempotencyMiddleware:
    """Stripe-style ``Idempotency-Key`` handling in front of an ASGI application.

    Args:
        app: the application.
        store: where keys and responses live (its TTL and clock apply).
        wait: seconds a concurrent duplicate waits for the first request
            before getting ``409``.
        methods: the methods keys apply to.
        lookup_path: also answer ``GET <lookup_path>/<key>`` (see
            :mod:`durably.receivers.lookup`); None (the default) leaves lookups
            to a :class:`LookupApp` you mount behind your own authentication.
        principal: who sent a request; keys are scoped by it (default:
            :func:`credentials_principal`: ``Authorization``, else the cookies).
        max_body: the longest keyed request body read, in bytes; longer is ``413``.
        max_response: the longest keyed response stored, in bytes; longer is sent
            unstored and its key refuses retries (``422``).
        transactional: the application writes each keyed request's effect
            through :func:`durably.receivers.postgres.transaction`, so it commits
            with the key's result (True for every keyed request, or a function
            of the ASGI scope saying which endpoints do). Needs a
            :class:`~durably.receivers.postgres.PostgresIdempotencyStore`.
    """

    def __init__(  # noqa: PLR0913 - the middleware's options, keyword-only with defaults
        self,
        app: ASGIApp,
        *,
        store: KeyStore,
        wait: float = 10.0,
        methods: Collection[str] = ("POST", "PUT", "PATCH", "DELETE"),
        lookup_path: str | None = None,
        principal: Principal | None = None,
        max_body: int = DEFAULT_MAX_BODY,
        max_response: int = DEFAULT_MAX_RESPONSE,
        transactional: bool | Callable[[Scope], bool] = False,
    ) -> None:
        self._effects: Callable[[Claimed], AbstractAsyncContextManager[Any]] | None = getattr(
            store, "effect", None
        )
        if transactional is not False and self._effects is None:
            raise ValueError(
                f"transactional= needs a key store whose transaction the effect can share "
                f"(PostgresIdempotencyStore); {type(store).__name__} keeps its keys apart "
                "from your effect: drop transactional= or move the keys to PostgreSQL"
            )
        self.transactional = transactional
        for name, limit in (("max_body", max_body), ("max_response", max_response)):
            if limit < 0:
                raise ValueError(f"{name} must be a number of bytes, at least 0; got {limit}")
        self.max_body = max_body
        self.max_response = max_response
        self.app = app
        self.store = store
        self.wait = wait
        self.methods = frozenset(m.upper() for m in methods)
        self.principal = principal or credentials_principal
        self.lookup = (
            LookupApp(store, prefix=lookup_path, principal=self.principal)
            if lookup_path is not None
            else None
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # noqa: C901 - the ASGI dispatch: passthrough, lookup, keyed request, each refusal named
        """Handle one ASGI connection."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.lookup is not None and self.lookup.matches(scope):
            await self.lookup(scope, receive, send)
            return
        raw_key = next((v for k, v in scope.get("headers", ()) if k == _HEADER), None)
        if raw_key is None or scope["method"] not in self.methods:
            await self.app(scope, receive, send)
            return
        key = raw_key.decode("latin-1")
        if not valid_key(key):
            await _send_json(send, 400, {"error": "invalid-idempotency-key", "key": key[:300]})
            return
        try:
            body = await _read_body(receive, scope, self.max_body)
        except _BodyTooLarge:
            await _send_json(
                send,
                413,
                {"error": "request-body-too-large", "key": key, "max_body": self.max_body},
            )
            return  # nothing ran and nothing was claimed: the same request is refused again
        if body is None:
            return  # the client left before sending its body; nothing ran
        transactional = (
            self.transactional(scope) if callable(self.transactional) else self.transactional
        )
        claim = await self.store.claim(
            key,
            _fingerprint(scope, body),
            principal=principal_digest(self.principal(scope)),
            wait=self.wait,
            **({"transactional": True} if transactional else {}),
        )
        if isinstance(claim, Replay):
            if isinstance(claim.result, StoredResponse):
                await _send_stored(send, claim.result, replayed=True)
            elif isinstance(claim.result, Unstored):
                await _send_json(
                    send,
                    422,
                    {
                        "error": "idempotency-key-response-not-stored",
                        "key": key,
                        "detail": "the first response with this key was over the "
                        f"{claim.result.limit} bytes this service keeps; it was sent once "
                        "and the request is not run again",
                    },
                )
            else:  # an MCP tool's key arriving over HTTP
                await _send_json(send, 422, {"error": "idempotency-key-reused", "key": key})
        elif isinstance(claim, Mismatch):
            await _send_json(
                send,
                422,
                {
                    "error": "idempotency-key-reused",
                    "key": key,
                    "detail": "this key was used with a different method, path or body",
                },
            )
        elif isinstance(claim, Abandoned):
            await _send_json(
                send,
                409,
                {
                    "error": "idempotency-key-abandoned",
                    "key": key,
                    "owner": claim.owner,
                    "detail": "the request with this key died with its process and may have "
                    "acted; it is not run again: its lookup says abandoned",
                },
            )
        elif isinstance(claim, Busy):
            await _send_json(
                send,
                409,
                {"error": "idempotency-key-in-flight", "key": key},
                extra=[(b"retry-after", b"1")],
            )
        elif transactional and self._effects is not None:
            async with renewing(self.store, claim), self._effects(claim) as effect:
                await self._run(claim, scope, _replaying(body, receive), send, finish=effect.finish)
        else:
            async with renewing(self.store, claim):
                await self._run(claim, scope, _replaying(body, receive), send)

    async def _run(  # noqa: C901 - the key's states in order (new, in flight, done, abandoned)
        self,
        claim: Claimed,
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        finish: Callable[[Stored], Awaitable[bool]] | None = None,
    ) -> None:
        """Run the application for a claimed key; ``finish`` stores its result (with its effect)."""

        async def store(result: Stored) -> bool:
            if finish is None:
                return await self.store.finish(claim, result)
            return await finish(result)

        status = 500
        start: Message | None = None
        chunks: list[bytes] = []
        size = 0
        finished = False  # the key's result is stored (or marked unstored)
        passing = False  # over max_response: the app's messages go straight to the client

        async def capture(message: Message) -> None:
            nonlocal status, start, size, finished, passing
            if passing:
                await send(message)
                return
            if message["type"] == "http.response.start":
                status = int(message["status"])
                start = message
            elif message["type"] == "http.response.body" and not finished:
                chunk = bytes(message.get("body", b""))
                more = bool(message.get("more_body", False))
                chunks.append(chunk)
                size += len(chunk)
                if size > self.max_response:
                    # Marked before the first byte leaves: a client that saw any of it
                    # and retries is refused, never run again.
                    finished = passing = True
                    if not await store(Unstored(status=status, limit=self.max_response)) and (
                        finish is not None
                    ):  # stalled past the lease, taken over: its effect rolled back
                        passing = False  # the rest of the response is dropped
                        await _send_json(send, 409, _TAKEN_OVER | {"key": claim.key})
                        return
                    await send(start or {"type": "http.response.start", "status": status})
                    body = b"".join(chunks)
                    chunks.clear()
                    await send({"type": "http.response.body", "body": body, "more_body": more})
                elif not more:
                    finished = True
                    headers = [
                        (bytes(k).decode("latin-1").lower(), bytes(v).decode("latin-1"))
                        for k, v in (start or {}).get("headers", ())
                    ]
                    response = StoredResponse(
                        status=status,
                        headers=[(k, v) for k, v in headers if k not in _NOT_STORED],
                        body=b"".join(chunks),
                    )
                    # Durable before the client sees it: a client that got an answer can
                    # always get the same answer again.
                    if await store(response) or finish is None:
                        # (Unstored only when a new request took the key after the TTL:
                        # this one acted all the same, and its client gets its answer.)
                        await _send_stored(send, response, replayed=False)
                    else:  # stalled past the lease, taken over: its effect rolled back
                        await _send_json(send, 409, _TAKEN_OVER | {"key": claim.key})

        try:
            await self.app(scope, receive, capture)
        except Exception:
            if not finished:
                finished = True
                # Its own commit: a transactional effect rolls back, but the handler
                # may have acted elsewhere before it raised.
                await self.store.finish(claim, _CRASHED)
            raise
        if not finished:  # the app returned without completing a response
            await self.store.finish(claim, _CRASHED)
            await _send_stored(send, _CRASHED, replayed=False)


class LookupApp:
    """An ASGI app answering ``GET <prefix>/<key>`` from an :class:`IdempotencyStore`.

    Mount it where your framework applies authentication: a stored response is
    as private as the request that produced it.
    """

    def __init__(
        self, store: KeyStore, *, prefix: str = "", principal: Principal | None = None
    ) -> None:
        self.store = store
        self.prefix = prefix.rstrip("/") + "/"
        self.principal = principal or credentials_principal

    def matches(self, scope: Scope) -> bool:
        """True for a GET under this app's prefix."""
        path: str = scope.get("path", "")
        return scope.get("method") == "GET" and path.startswith(self.prefix)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer one lookup."""
        if scope["type"] != "http":
            return
        key = scope.get("path", "")[len(self.prefix) :] if self.matches(scope) else ""
        if not valid_key(key):
            await _send_json(send, 400, {"error": "invalid-idempotency-key"})
            return
        principal = principal_digest(self.principal(scope))
        answer = http_answer(await lookup(self.store, key, principal=principal))
        await _send_stored(
            send,
            StoredResponse(status=answer.status, headers=answer.headers, body=answer.body),
            replayed=False,
        )


def credentials_principal(scope: Scope) -> bytes | None:
    """The default principal: the request's ``Authorization`` header, else its cookies, else None.

    Cookies count only without ``Authorization``: an API client's cookie jar
    picks up whatever a response sets, and a retry must not become another
    principal's request because of it.
    """
    headers = scope.get("headers", ())
    for name in _CREDENTIALS:
        found = sorted(bytes(v) for k, v in headers if k == name)
        if found:
            return name + b"=" + b"\0".join(found)
    return None


def _fingerprint(scope: Scope, body: bytes) -> str:
    digest = hashlib.sha256(b"http\0")
    for part in (scope["method"], scope.get("path", ""), scope.get("query_string", b"")):
        data = part.encode("utf-8") if isinstance(part, str) else bytes(part)
        digest.update(b"%d:" % len(data))
        digest.update(data)
    digest.update(hashlib.sha256(body).digest())
    return digest.hexdigest()


class _BodyTooLarge(Exception):
    """A keyed request's body is over ``max_body`` (declared or sent)."""


async def _read_body(receive: Receive, scope: Scope, limit: int) -> bytes | None:
    """The request's body, None if the client left first; over ``limit``: ``_BodyTooLarge``.

    A declared ``Content-Length`` over the limit is refused before a byte is read;
    a body sent in chunks is refused at the chunk that crosses it, the rest unread.
    """
    declared = next((v for k, v in scope.get("headers", ()) if k == b"content-length"), b"")
    if declared.strip().isdigit() and int(declared) > limit:
        raise _BodyTooLarge
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        if message["type"] == "http.request":
            chunk = bytes(message.get("body", b""))
            size += len(chunk)
            if size > limit:
                raise _BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the app the body already read, then the real channel."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _send_stored(send: Send, response: StoredResponse, *, replayed: bool) -> None:
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers]
    if not any(k == b"content-length" for k, _ in headers):
        headers.append((b"content-length", str(len(response.body)).encode()))
    if replayed:
        headers.append((REPLAYED_HEADER.lower().encode("latin-1"), b"true"))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body, "more_body": False})


async def _send_json(
    send: Send, status: int, body: dict[str, Any], *, extra: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    data = msgspec.json.encode(body)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *extra,
            ],
        }
    )
    await send({"type": "http.response.body", "body": data, "more_body": False})
