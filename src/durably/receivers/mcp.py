"""The MCP server's half: run a tool call once per idempotency key.

durably sends each call's key in the ``tools/call`` request's ``_meta`` under
``io.durably/idempotency-key`` (:data:`META_KEY`). :func:`deduplicated` wraps a
tool function of the SDK's high-level server (``MCPServer``, formerly
``FastMCP``) so that, for calls carrying a key, it behaves as the HTTP
middleware does:

- the first call with the key runs; what it returned (in its JSON form) or
  the error it raised is stored durably before the result leaves the server;
- a later call with the key and the same arguments gets the stored result
  (or the same error) without running the function;
- the same key with other arguments (or for another tool) is an error;
- a call with the key while the first is still running waits up to ``wait``
  seconds for it, then is an error saying the call is still in flight;
- a call with a key whose first call died with its server process (its lease
  lapsed) is an error saying so, never a second run: the first may have acted,
  and the key's lookup says ``abandoned``;
- a key older than the store's TTL counts as new.

Keys are scoped by principal (per client), as the HTTP middleware scopes them:
by default the principal is the ``Authorization`` header (else the cookies) of
the HTTP request that carried the call (hashed), and nobody in particular over
stdio, where the one client is the process that started the server. The same
key from another principal is a new call, never a replay of another client's
result. Pass ``principal=`` (a function of the ``Context``) to name clients
yourself, for instance by the user your authentication found.

Calls without a key run as before. ::

    store = IdempotencyStore("keys.sqlite3")
    server = MCPServer("orders")

    @server.tool()
    @deduplicated(store)
    async def place_order(item: str, quantity: int, ctx: Context) -> str:
        ...

The function needs a ``Context`` parameter: the key is in the request's
``_meta``, which only the context shows (the SDK fills it in; it is not part of
the tool's schema). A replayed return value is its JSON form: a ``str`` comes
back as the same ``str``, a model as a ``dict``.

A low-level server reads the key with :func:`key_from_meta` and uses
:class:`IdempotencyStore` ``claim``/``finish`` around its own handler.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import typing
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import msgspec

from ..transports.mcp import META_KEY
from ._keys import (
    Abandoned,
    Busy,
    Claimed,
    KeyStore,
    Mismatch,
    Replay,
    StoredOutcome,
    principal_digest,
    renewing,
    valid_key,
)

__all__ = ["META_KEY", "ReplayedError", "deduplicated", "key_from_meta", "request_credentials"]

_F = TypeVar("_F", bound=Callable[..., Awaitable[Any]])


class ReplayedError(Exception):
    """Raised in place of the exception a deduplicated tool raised the first time for a key."""


def key_from_meta(meta: Any) -> str | None:
    """The durably idempotency key in a request's ``_meta``, or None.

    Accepts the SDK's ``_meta`` in either form: a mapping (SDK 2) or a pydantic
    model keeping unknown entries as extras (SDK 1).
    """
    if meta is None:
        return None
    if isinstance(meta, Mapping):
        value = meta.get(META_KEY)
    else:
        value = (getattr(meta, "model_extra", None) or {}).get(META_KEY)
    return value if isinstance(value, str) and value else None


def deduplicated(
    store: KeyStore,
    *,
    wait: float = 10.0,
    name: str | None = None,
    principal: Callable[[Any], str | bytes | None] | None = None,
) -> Callable[[_F], _F]:
    """Make an async MCP tool function run once per idempotency key.

    Apply it below the server's ``tool()`` decorator, so the server sees the
    original signature.

    Args:
        store: where keys and results live (its TTL and clock apply).
        wait: seconds a concurrent call with the same key waits for the first.
        name: the tool's name in the key's fingerprint (default: the function's).
        principal: who made a call, from its ``Context``; keys are scoped by it
            (default: :func:`request_credentials`).
    """
    who = principal or request_credentials

    def decorate(function: _F) -> _F:
        if not inspect.iscoroutinefunction(function):
            raise TypeError(f"deduplicated needs an async function, got {function!r}")
        context_name = _context_parameter(function)
        signature = inspect.signature(function)
        tool = name or function.__name__

        @functools.wraps(function)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            context = bound.arguments.get(context_name)
            key = key_from_meta(_request_meta(context))
            if key is None:
                return await function(*args, **kwargs)
            sdk = _sdk()
            if not valid_key(key):
                raise sdk.ToolError(f"{META_KEY} is not a valid idempotency key")
            values = {n: v for n, v in bound.arguments.items() if n != context_name}
            claim = await store.claim(
                key,
                _fingerprint(tool, values),
                principal=principal_digest(who(context)),
                wait=wait,
            )
            if isinstance(claim, Replay):
                return _replay(claim.result, sdk)
            if isinstance(claim, Mismatch):
                raise sdk.ToolError(
                    f"idempotency key {key} was used before with other arguments or another tool"
                )
            if isinstance(claim, Abandoned):
                raise sdk.ToolError(
                    f"the call with idempotency key {key} died with its server process and "
                    "may have acted; it is not run again (its lookup says abandoned)"
                )
            if isinstance(claim, Busy):
                raise sdk.ToolError(
                    f"a call with idempotency key {key} is still running; try again later"
                )
            return await _run_claimed(store, claim, sdk, function(*args, **kwargs))

        return typing.cast(_F, wrapper)

    return decorate


async def _run_claimed(store: KeyStore, claim: Claimed, sdk: _Sdk, call: Awaitable[Any]) -> Any:
    from pydantic_core import to_jsonable_python

    try:
        async with renewing(store, claim):
            value = await call
    except Exception as exc:
        await store.finish(
            claim, StoredOutcome(error=str(exc), tool_error=isinstance(exc, sdk.ToolError))
        )
        raise
    await store.finish(claim, StoredOutcome(value=to_jsonable_python(value)))
    return value


def _replay(result: object, sdk: _Sdk) -> Any:
    if not isinstance(result, StoredOutcome):  # an HTTP response stored under the same key
        raise sdk.ToolError("this idempotency key belongs to an HTTP request")
    if result.error is None:
        return result.value
    if result.tool_error:
        raise sdk.ToolError(result.error)
    raise ReplayedError(result.error)


def _fingerprint(tool: str, values: Mapping[str, Any]) -> str:
    from pydantic_core import to_jsonable_python

    canonical = msgspec.json.encode(to_jsonable_python(dict(values)), order="sorted")
    digest = hashlib.sha256(b"mcp\0")
    digest.update(tool.encode("utf-8") + b"\0")
    digest.update(canonical)
    return digest.hexdigest()


def request_credentials(context: Any) -> bytes | None:
    """The default principal: the call's HTTP ``Authorization`` header, else its cookies.

    None over stdio (no HTTP request): the one client is the process that
    started the server.
    """
    try:
        request = context.request_context.request
    except (AttributeError, ValueError):
        return None
    headers = getattr(request, "headers", None)
    if headers is None:
        return None
    for name in ("authorization", "cookie"):  # cookies only without Authorization, as over HTTP
        value = headers.get(name)
        if value:
            return f"{name}={value}".encode()
    return None


def _request_meta(context: Any) -> Any:
    """The request's ``_meta``, or None for a call made outside a request (a direct call)."""
    if context is None:
        return None
    try:
        request = context.request_context
    except (AttributeError, ValueError):  # SDK 2 raises ValueError outside a request
        return None
    return getattr(request, "meta", None)


class _Sdk:
    """The SDK's Context and ToolError classes, from SDK 2 or SDK 1."""

    def __init__(self) -> None:
        try:
            server = importlib.import_module("mcp.server.mcpserver")
            errors = importlib.import_module("mcp.server.mcpserver.exceptions")
        except ImportError:  # SDK 1: the high-level server was FastMCP
            server = importlib.import_module("mcp.server.fastmcp")
            errors = importlib.import_module("mcp.server.fastmcp.exceptions")
        self.Context: type[Any] = server.Context
        self.ToolError: type[Exception] = errors.ToolError


@functools.cache
def _sdk() -> _Sdk:
    return _Sdk()


def _context_parameter(function: Callable[..., Any]) -> str:
    context_class = _sdk().Context
    for parameter, hint in typing.get_type_hints(function).items():
        candidates = (hint, *typing.get_args(hint))
        if any(inspect.isclass(c) and issubclass(c, context_class) for c in candidates):
            return parameter
    raise TypeError(
        f"{function.__name__} needs a Context parameter (ctx: Context): the idempotency key "
        "travels in the request's _meta, which only the context shows"
    )
