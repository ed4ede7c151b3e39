"""MCP tools: the tools of an MCP server, as durably tools with effects you declare.

::

    async with stdio_client(StdioServerParameters(command="orders-server")) as (r, w):
        async with ClientSession(r, w) as session:
            await session.initialize()
            tools = await mcp_tools(session, effects={"place_order": Effect.KEYED,
                                                      "list_orders": Effect.READ})
            outcome = await Agent(model=model, tools=tools, store=store).run(task)

The server's tool list gives names, descriptions and argument schemas; what a
tool does to the world comes from ``effects``, which you write after reading
what the server promises. MCP's annotations (``readOnlyHint``,
``idempotentHint``) are hints from the server's author, not guarantees, so they
count only with ``trust_annotations=True`` and never make a tool ``keyed``.

Every call that can change something carries the call's idempotency key in the
request's ``_meta`` under :data:`META_KEY` (``io.durably/idempotency-key``),
never in the arguments; :func:`durably.receivers.mcp.deduplicated` is the
server's half. The result the model sees is the text of the result's content
blocks (JSON for other blocks); an ``isError`` result raises
:class:`McpToolError`, which the loop gives the model as an error result.

The argument schema is the server's; arguments are checked here only for being
a JSON object with the required properties, and the server validates the rest.
A lookup for an MCP tool (``lookups=``) is an async function
``(ctx, *, arguments) -> Found | NOT_FOUND | UNKNOWN``.

The ``mcp`` package is only needed by the session you pass in; this module
imports none of it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, Protocol

import msgspec

from ..errors import DurablyError
from ..state import Effect
from ..tools import (
    KeyLifetime,
    LookupFunction,
    Tool,
    ToolContext,
    ToolFunction,
    ToolInputError,
    checked_key_ttl,
)

__all__ = ["META_KEY", "McpSession", "McpToolError", "mcp_tools"]

META_KEY: Final = "io.durably/idempotency-key"
"""The ``_meta`` entry of a ``tools/call`` request that carries the call's idempotency key."""


class McpToolError(DurablyError):
    """Raised by an MCP tool when the server answers with ``isError``; the model reads the text."""


class McpSession(Protocol):
    """What :func:`mcp_tools` needs of an MCP client session (``mcp.ClientSession`` has it)."""

    async def list_tools(self) -> Any:
        """The server's tools (the first page; later pages are asked for by cursor)."""
        ...

    async def call_tool(
        self, name: str, arguments: dict[str, Any] | None = None, *, meta: Any = None
    ) -> Any:
        """Call one tool with arguments and request ``_meta``."""
        ...


class _Arguments(msgspec.Struct, frozen=True):
    """The keyword arguments an MCP tool's function and lookup receive."""

    arguments: dict[str, Any]


@dataclass(frozen=True, kw_only=True, eq=False)
class _RemoteTool(Tool):
    """A tool whose argument schema belongs to a server, which validates the arguments."""

    def parse(self, raw: str) -> dict[str, Any]:
        """Check the raw arguments are a JSON object with the schema's required properties.

        Raises:
            ToolInputError: with a message for the model.
        """
        try:
            value = msgspec.json.decode(raw or "{}")
        except msgspec.DecodeError as exc:
            raise ToolInputError(f"arguments are not valid JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise ToolInputError(f"arguments of {self.name} must be a JSON object")
        missing = [name for name in self.schema.get("required", ()) if name not in value]
        if missing:
            raise ToolInputError(f"{self.name} needs the arguments {', '.join(missing)}")
        properties = self.schema.get("properties", {})
        if self.schema.get("additionalProperties") is False:
            unknown = sorted(set(value) - set(properties))
            if unknown:
                raise ToolInputError(f"{self.name} takes no arguments {', '.join(unknown)}")
        return {"arguments": value}


async def mcp_tools(
    session: McpSession,
    *,
    effects: Mapping[str, Effect],
    trust_annotations: bool = False,
    only: Collection[str] | None = None,
    needs_approval: Collection[str] = (),
    key_ttl: Mapping[str, timedelta | KeyLifetime] | None = None,
    lookups: Mapping[str, LookupFunction] | None = None,
) -> list[Tool]:
    """Wrap an MCP server's tools as durably tools.

    Args:
        session: an initialized MCP client session (stdio or streamable HTTP).
        effects: each tool's effect, by name; a tool with none is an error
            (unless ``trust_annotations`` gives it one, or ``only`` leaves it out).
        trust_annotations: take ``readOnlyHint`` as ``read`` and
            ``idempotentHint`` as ``idempotent`` for tools missing from
            ``effects``. Off by default: annotations are the server's claims.
        only: wrap just these tools (default: every tool the server lists).
        needs_approval: tools to ask the approver about before each call.
        key_ttl: how long the server remembers keys: required for each ``keyed``
            tool (a little below the server's TTL, or ``durably.NEVER_EXPIRES``).
        lookups: a lookup for an in-doubt call, by tool name (``write`` and
            ``keyed`` tools).

    Raises:
        ValueError: a tool without an effect, or a name that the server does
            not list, ``key_ttl`` for a tool that is not ``keyed``, or none for
            one that is.
    """
    listed = await _list_tools(session)
    served = {tool["name"]: tool for tool in listed}
    key_ttl = dict(key_ttl or {})
    lookups = dict(lookups or {})
    for what, names in (
        ("effects", effects),
        ("only", only or ()),
        ("needs_approval", needs_approval),
        ("key_ttl", key_ttl),
        ("lookups", lookups),
    ):
        strangers = sorted(set(names) - served.keys())
        if strangers:
            raise ValueError(
                f"{what} names tools the server does not list: {', '.join(strangers)} "
                f"(it lists {', '.join(sorted(served)) or 'none'})"
            )
    chosen = [served[name] for name in served if only is None or name in only]
    declared = {t["name"]: _effect(t, effects, trust=trust_annotations) for t in chosen}
    undeclared = sorted(name for name, effect in declared.items() if effect is None)
    if undeclared:
        raise ValueError(
            f"declare an effect for {', '.join(undeclared)} in effects= (read, idempotent, "
            "keyed or write), or leave them out with only=[...]"
        )
    tools: list[Tool] = []
    for spec in chosen:
        name = spec["name"]
        effect = declared[name]
        if effect is None:  # for the type checker: undeclared tools raised above
            continue
        if name in key_ttl and effect is not Effect.KEYED:
            raise ValueError(f"key_ttl for {name}: only keyed tools send a key the server keeps")
        ttl = checked_key_ttl(effect, key_ttl.get(name), name, required=True)
        tools.append(
            _RemoteTool(
                name=name,
                description=spec.get("description") or spec.get("title") or name,
                effect=effect,
                function=_caller(session, name, effect),
                arguments=_Arguments,
                schema=dict(spec.get("inputSchema") or {"type": "object"}),
                needs_approval=name in needs_approval,
                key_ttl=ttl,
                lookup=lookups.get(name),
            )
        )
    return tools


def _effect(
    spec: Mapping[str, Any], effects: Mapping[str, Effect], *, trust: bool
) -> Effect | None:
    declared = effects.get(spec["name"])
    if declared is not None:
        if not isinstance(declared, Effect):
            raise TypeError(f"effect of {spec['name']} must be a durably.Effect, got {declared!r}")
        return declared
    if not trust:
        return None
    hints = spec.get("annotations") or {}
    if hints.get("readOnlyHint") is True:
        return Effect.READ
    if hints.get("idempotentHint") is True:
        return Effect.IDEMPOTENT
    return None


def _caller(session: McpSession, name: str, effect: Effect) -> ToolFunction:
    async def call(ctx: ToolContext, *, arguments: dict[str, Any]) -> str:
        meta = None if effect is Effect.READ else {META_KEY: ctx.idempotency_key}
        result = _wire(await session.call_tool(name, arguments, meta=meta))
        text = _text(result)
        if result.get("isError"):
            raise McpToolError(text)
        return text

    return call


async def _list_tools(session: McpSession) -> list[dict[str, Any]]:
    """Every tool the server lists, in wire form (camelCase keys), across pages."""
    page = await session.list_tools()
    tools = [_wire(tool) for tool in page.tools]
    cursor = getattr(page, "next_cursor", None) or getattr(page, "nextCursor", None)
    while cursor:
        from mcp.types import PaginatedRequestParams

        # Later pages: the paging parameter of ClientSession.list_tools (not in the protocol).
        list_page: Any = session.list_tools
        page = await list_page(params=PaginatedRequestParams(cursor=cursor))
        tools.extend(_wire(tool) for tool in page.tools)
        cursor = getattr(page, "next_cursor", None) or getattr(page, "nextCursor", None)
    return tools


def _wire(model: Any) -> dict[str, Any]:
    """A protocol object as it travels (camelCase keys), whatever the SDK's field names."""
    dumped: dict[str, Any] = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped


def _text(result: Mapping[str, Any]) -> str:
    parts = []
    for block in result.get("content") or ():
        if block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        else:
            parts.append(msgspec.json.encode(block).decode())
    if not parts and result.get("structuredContent") is not None:
        return msgspec.json.encode(result["structuredContent"]).decode()
    return "\n".join(parts)
