"""Tools: typed async functions with an honest declaration of what they do.

A tool is declared with :func:`tool`. Its effect is required: the author must
say whether it only reads, can be repeated harmlessly, sends an idempotency key
the service deduplicates on, or writes without one. The argument schema comes
from the function's type hints (msgspec builds the JSON Schema and validates);
arguments that are not valid JSON or do not fit never reach the function.

A tool receives a :class:`ToolContext` first: the run ID, the call ID, the
idempotency key (to send in the harness's channel, never in model-written
arguments), the workspace, a clock, and for an in-doubt call the hashes its
files were meant to get.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, get_type_hints

import msgspec

from ._values import describe, text_problem
from .state import Effect
from .workspace import Workspace

__all__ = [
    "NOT_FOUND",
    "UNKNOWN",
    "Found",
    "Lookup",
    "Tool",
    "ToolContext",
    "ToolInDoubt",
    "ToolInputError",
    "ToolResultError",
    "tool",
]


@dataclass(frozen=True, kw_only=True)
class ToolContext:
    """What a tool knows about the call it is serving."""

    run_id: str
    call_id: str
    idempotency_key: str
    """Stable across retries of this call, unique across calls; send it to the service."""
    workspace: Workspace | None
    clock: Callable[[], datetime]
    intended: Mapping[str, str] = field(default_factory=dict)
    """For an in-doubt call: workspace path -> SHA-256 its write was meant to produce."""


@dataclass(frozen=True)
class Found:
    """A lookup's answer: the call did happen, and this is its result.

    Raises:
        TypeError: ``result`` is not text the run state can hold (the model sees
            it as the call's result, so it must be a ``str``: ``str(order.id)``).
    """

    result: str

    def __post_init__(self) -> None:
        problem = text_problem(self.result)
        if problem:
            raise TypeError(f"Found.result must be the text the model will see: {problem}")


class _Answer:
    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return f"durably.{self._name}"


NOT_FOUND: Final = _Answer("NOT_FOUND")
"""A lookup's answer: the call certainly did not happen."""
UNKNOWN: Final = _Answer("UNKNOWN")
"""A lookup's answer: cannot tell (an error, a lagging index); the ladder asks a person."""

Lookup = Found | _Answer

ToolFunction = Callable[..., Awaitable[Any]]
LookupFunction = Callable[..., Awaitable[Lookup]]
IntentFunction = Callable[..., Awaitable[Mapping[str, bytes | str]]]


class ToolInputError(Exception):
    """The model's arguments for a call cannot be used; the message goes back to the model."""


class ToolResultError(Exception):
    """A tool (or its ``intends``) returned a value the run state cannot hold.

    The loop gives the model this message as the call's error result, like any
    exception the tool raised.
    """


class ToolInDoubt(Exception):
    """Raised by a tool that cannot tell whether it acted (a request sent, no answer).

    The loop keeps the call's attempt marker and settles it at once through the
    resolution ladder, as it would after a crash, instead of handing the model an
    error it might "fix" with a new call (and a new idempotency key).
    """


@dataclass(frozen=True, kw_only=True, eq=False)
class Tool:
    """A tool as the loop sees it. Build one with :func:`tool`."""

    name: str
    description: str
    effect: Effect
    function: ToolFunction
    arguments: type[msgspec.Struct]
    schema: dict[str, Any]
    needs_approval: bool = False
    key_ttl: timedelta | None = None
    """How long the service remembers keys (``keyed`` only); None means for ever."""
    lookup: LookupFunction | None = None
    intends: IntentFunction | None = None
    """Computes the files a call will write (path -> content) before it runs."""

    @property
    def schema_sha256(self) -> str:
        """A hash of the schema, for the run's fingerprint."""
        canonical = msgspec.json.encode(self.schema, order="sorted")
        return hashlib.sha256(canonical).hexdigest()

    def parse(self, raw: str) -> dict[str, Any]:
        """Parse and validate raw model arguments into keyword arguments.

        Raises:
            ToolInputError: with a message for the model.
        """
        try:
            value = msgspec.json.decode(raw or "{}", type=self.arguments)
        except msgspec.ValidationError as exc:
            raise ToolInputError(
                f"arguments do not match the schema of {self.name}: {exc}"
            ) from exc
        except msgspec.DecodeError as exc:
            raise ToolInputError(f"arguments are not valid JSON: {exc}") from exc
        return {name: getattr(value, name) for name in self.arguments.__struct_fields__}

    async def __call__(self, ctx: ToolContext, **kwargs: Any) -> str:
        """Run the tool and return its result as text (JSON for anything that is not text).

        Raises:
            ToolResultError: the result is text UTF-8 cannot encode, or a value JSON
                cannot hold; the message names the tool and the call.
        """
        value = await self.function(ctx, **kwargs)
        if isinstance(value, str):
            problem = text_problem(value)
        else:
            try:
                return msgspec.json.encode(value).decode()
            except (TypeError, ValueError, OverflowError, RecursionError) as exc:
                problem = f"{describe(value)} cannot be written as JSON ({exc})"
        if problem is None:
            return str(value)
        raise ToolResultError(
            f"tool {self.name!r} returned a result for call {ctx.call_id!r} that cannot be "
            f"saved: {problem}; return a str or a JSON value (dicts with str keys, lists, "
            "numbers, str, bool, None)"
        )

    async def intended_files(self, ctx: ToolContext, **kwargs: Any) -> dict[str, bytes]:
        """The files ``intends`` says the call will write, checked (empty without ``intends``).

        Raises:
            ToolResultError: ``intends`` returned something other than a mapping of
                workspace paths (str) to contents (bytes or str).
        """
        if self.intends is None:
            return {}
        files = await self.intends(ctx, **kwargs)
        where = f"intends of tool {self.name!r} for call {ctx.call_id!r}"
        if not isinstance(files, Mapping):
            raise ToolResultError(f"{where} returned {describe(files)}; return {{path: content}}")
        checked: dict[str, bytes] = {}
        for path, content in files.items():
            if problem := text_problem(path):
                raise ToolResultError(f"{where} named a path that cannot be saved: {problem}")
            if isinstance(content, str):
                if problem := text_problem(content):
                    raise ToolResultError(f"{where}: the content of {path!r}: {problem}")
                checked[path] = content.encode()
            elif isinstance(content, bytes | bytearray | memoryview):
                checked[path] = bytes(content)
            else:
                raise ToolResultError(
                    f"{where}: the content of {path!r} is {describe(content)}, not bytes or str"
                )
        return checked


def tool(
    *,
    effect: Effect,
    needs_approval: bool = False,
    key_ttl: timedelta | None = None,
    lookup: LookupFunction | None = None,
    intends: IntentFunction | None = None,
    name: str | None = None,
    description: str | None = None,
) -> Callable[[ToolFunction], Tool]:
    """Declare a tool from a typed async function whose first parameter is the context.

    Args:
        effect: what the tool does to the world; there is no default on purpose.
        needs_approval: ask the approver before each call.
        key_ttl: how long the service remembers idempotency keys (``keyed``).
        lookup: async function taking the same arguments, answering whether an
            in-doubt call happened: ``Found(result)``, ``NOT_FOUND`` or ``UNKNOWN``.
        intends: async function taking the same arguments and returning the
            files the call will write; their hashes go into the attempt marker.
        name: the tool's name (default: the function's).
        description: what the model is told (default: the docstring).
    """
    if not isinstance(effect, Effect):
        raise TypeError(f"effect must be a durably.Effect, got {effect!r}")
    if key_ttl is not None and effect is not Effect.KEYED:
        raise ValueError("key_ttl only applies to tools with effect=Effect.KEYED")

    def decorate(function: ToolFunction) -> Tool:
        if not inspect.iscoroutinefunction(function):
            raise TypeError(f"tool {function.__name__} must be an async function")
        tool_name = name or function.__name__
        arguments, schema = _described(function, tool_name)
        return Tool(
            name=tool_name,
            description=description or inspect.getdoc(function) or tool_name,
            effect=effect,
            function=function,
            arguments=arguments,
            schema=schema,
            needs_approval=needs_approval,
            key_ttl=key_ttl,
            lookup=lookup,
            intends=intends,
        )

    return decorate


_descriptions: dict[tuple[object, ...], tuple[type[msgspec.Struct], dict[str, Any]]] = {}


def _described(
    function: ToolFunction, tool_name: str
) -> tuple[type[msgspec.Struct], dict[str, Any]]:
    """The arguments' struct and schema, made once per function definition.

    Tools are often defined inside a factory called once per run (the sweep
    builds every scenario's agent anew), and building the schema costs more
    than the rest of the agent. Functions with the same code, defaults and
    annotations take the same arguments, so they share the result.
    """
    code = getattr(function, "__code__", None)
    key: tuple[object, ...]
    try:
        key = (
            code,
            tool_name,
            getattr(function, "__defaults__", None),
            tuple(sorted((getattr(function, "__kwdefaults__", None) or {}).items())),
            tuple(function.__annotations__.items()),
        )
        known = _descriptions.get(key) if code is not None else None
    except TypeError:  # an unhashable default or annotation: describe it every time
        key, known = (), None
    if known is None:
        arguments = _arguments_struct(function, tool_name)
        known = (arguments, _schema(arguments))
        if key:
            _descriptions[key] = known
    return known[0], copy.deepcopy(known[1])


def _arguments_struct(function: ToolFunction, tool_name: str) -> type[msgspec.Struct]:
    signature = inspect.signature(function)
    hints = get_type_hints(function)
    parameters = list(signature.parameters.values())
    if not parameters:
        raise TypeError(f"tool {tool_name} must take a ToolContext as its first parameter")
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for parameter in parameters[1:]:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise TypeError(f"tool {tool_name}: *args and **kwargs cannot be described to a model")
        if parameter.name not in hints:
            raise TypeError(f"tool {tool_name}: parameter {parameter.name!r} needs a type hint")
        if parameter.default is parameter.empty:
            fields.append((parameter.name, hints[parameter.name]))
        else:
            fields.append((parameter.name, hints[parameter.name], parameter.default))
    return msgspec.defstruct(
        f"{tool_name}_arguments", fields, forbid_unknown_fields=True, kw_only=True
    )


def _schema(arguments: type[msgspec.Struct]) -> dict[str, Any]:
    """An inline JSON Schema object for the arguments (no top-level ``$ref``)."""
    (schema,), components = msgspec.json.schema_components([arguments])
    ref = schema["$ref"].rsplit("/", 1)[-1]
    body = dict(components.pop(ref))
    body.pop("title", None)
    if components:
        body["$defs"] = components
    return body
