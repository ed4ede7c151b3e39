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

Every declaration is checked where it is made, with a ``TypeError`` or
``ValueError`` naming the fix: a function without a context parameter, a lookup
or ``intends`` whose parameters differ from the tool's, a ``keyed`` tool that
does not say how long its service keeps keys. A ``keyed`` call that returns
without having read its key is reported with a :class:`KeyNotSent` warning
(an error where warnings are errors: ``durably.testing.strict()``, or pytest's
``filterwarnings = ["error"]``).
"""

from __future__ import annotations

import copy
import enum
import hashlib
import inspect
import warnings
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Concatenate, Final, Literal, get_type_hints, overload

import msgspec

from ._values import describe, text_problem
from .state import Effect
from .workspace import Workspace

__all__ = [
    "NEVER_EXPIRES",
    "NOT_FOUND",
    "UNKNOWN",
    "Found",
    "KeyLifetime",
    "KeyNotSent",
    "Lookup",
    "NotFound",
    "Tool",
    "ToolContext",
    "ToolInDoubt",
    "ToolInputError",
    "ToolResultError",
    "Unknown",
    "checked_key_ttl",
    "tool",
]


@dataclass(frozen=True, init=False)
class ToolContext:
    """What a tool knows about the call it is serving.

    Reading :attr:`idempotency_key` is how durably knows a ``keyed`` tool sent
    its key: a keyed call that returns without reading it raises the
    :class:`KeyNotSent` warning.
    """

    run_id: str
    call_id: str
    workspace: Workspace | None
    clock: Callable[[], datetime]
    intended: Mapping[str, str]
    """For an in-doubt call: workspace path -> SHA-256 its write was meant to produce."""

    def __init__(
        self,
        *,
        run_id: str,
        call_id: str,
        idempotency_key: str,
        workspace: Workspace | None,
        clock: Callable[[], datetime],
        intended: Mapping[str, str] | None = None,
    ) -> None:
        put = object.__setattr__  # frozen: the fields are set once, here
        put(self, "run_id", run_id)
        put(self, "call_id", call_id)
        put(self, "workspace", workspace)
        put(self, "clock", clock)
        put(self, "intended", dict(intended or {}))
        put(self, "_key", idempotency_key)
        put(self, "_key_read", False)

    @property
    def idempotency_key(self) -> str:
        """Stable across retries of this call, unique across calls; send it to the service."""
        object.__setattr__(self, "_key_read", True)
        key: str = object.__getattribute__(self, "_key")
        return key

    @property
    def key_read(self) -> bool:
        """Whether :attr:`idempotency_key` was read during this call."""
        read: bool = object.__getattribute__(self, "_key_read")
        return read


class Lookup:
    """What a tool's lookup answers about a call found in doubt after a crash.

    A lookup is an async function taking the tool's own parameters (the
    context first) and asking the service whether the call happened. It
    answers one of three:

    - ``Found(result)``: it happened; ``result`` is what the model sees as the
      call's result;
    - ``NOT_FOUND``: it certainly did not happen; the call runs;
    - ``UNKNOWN``: cannot tell (an error, a lagging index); a person is asked.
      A lookup that raises counts as ``UNKNOWN``.

    Annotate a lookup's return type as ``durably.Lookup``.
    """

    __slots__ = ()


@dataclass(frozen=True)
class Found(Lookup):
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


class NotFound(Lookup):
    """The type of :data:`NOT_FOUND`: the call certainly did not happen."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "durably.NOT_FOUND"


class Unknown(Lookup):
    """The type of :data:`UNKNOWN`: the lookup cannot tell; the ladder asks a person."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "durably.UNKNOWN"


NOT_FOUND: Final = NotFound()
"""A lookup's answer: the call certainly did not happen."""
UNKNOWN: Final = Unknown()
"""A lookup's answer: cannot tell (an error, a lagging index); the ladder asks a person."""


class KeyLifetime(enum.Enum):
    """The type of :data:`NEVER_EXPIRES`, a ``key_ttl`` for services that keep keys for ever."""

    NEVER_EXPIRES = "never expires"

    def __repr__(self) -> str:
        return "durably.NEVER_EXPIRES"


NEVER_EXPIRES: Final = KeyLifetime.NEVER_EXPIRES
"""``key_ttl=durably.NEVER_EXPIRES``: the service remembers every key for ever."""


class KeyNotSent(UserWarning):
    """A ``keyed`` tool returned without reading ``ctx.idempotency_key``.

    Its service got no key to deduplicate on, so a crash after the call and
    before its result is saved repeats the effect when the run resumes. Send
    the key (``http_tool`` and ``mcp_tools`` do), declare the tool ``write``
    with a lookup, or declare ``key_check=False`` if it sends the key another way.
    Warned once per tool; an error where warnings are errors
    (``durably.testing.strict()``), and then the run stops instead of going on.
    """


ToolFunction = Callable[Concatenate[ToolContext, ...], Awaitable[Any]]
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
    """How long the service remembers keys (``keyed`` only); None means for ever
    (:func:`tool` takes ``key_ttl=NEVER_EXPIRES`` for that)."""
    key_check: bool = True
    """Warn (:class:`KeyNotSent`) when a ``keyed`` call returns without reading its key."""
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
        if self.effect is Effect.KEYED and self.key_check and not getattr(ctx, "key_read", True):
            warnings.warn(
                KeyNotSent(
                    f"keyed tool {self.name!r} returned without reading "
                    "ctx.idempotency_key: its service cannot deduplicate a rerun, so a crash "
                    "after this call and before its result is saved repeats it. Send "
                    "ctx.idempotency_key to the service (http_tool and mcp_tools send it "
                    "themselves), declare the tool effect=Effect.WRITE with a lookup, or, if it "
                    "sends the key another way, declare key_check=False"
                ),
                stacklevel=2,
            )
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


@overload
def tool(
    *,
    effect: Literal[Effect.KEYED],
    key_ttl: timedelta | KeyLifetime,
    needs_approval: bool = ...,
    key_check: bool = ...,
    lookup: LookupFunction | None = ...,
    intends: IntentFunction | None = ...,
    name: str | None = ...,
    description: str | None = ...,
) -> Callable[[ToolFunction], Tool]: ...
@overload
def tool(
    *,
    effect: Literal[Effect.READ, Effect.IDEMPOTENT, Effect.WRITE],
    key_ttl: None = ...,
    needs_approval: bool = ...,
    lookup: LookupFunction | None = ...,
    intends: IntentFunction | None = ...,
    name: str | None = ...,
    description: str | None = ...,
) -> Callable[[ToolFunction], Tool]: ...
@overload
def tool(
    *,
    effect: Effect,
    key_ttl: timedelta | KeyLifetime | None,
    needs_approval: bool = ...,
    key_check: bool = ...,
    lookup: LookupFunction | None = ...,
    intends: IntentFunction | None = ...,
    name: str | None = ...,
    description: str | None = ...,
) -> Callable[[ToolFunction], Tool]: ...
def tool(
    *,
    effect: Effect,
    key_ttl: timedelta | KeyLifetime | None = None,
    needs_approval: bool = False,
    key_check: bool = True,
    lookup: LookupFunction | None = None,
    intends: IntentFunction | None = None,
    name: str | None = None,
    description: str | None = None,
) -> Callable[[ToolFunction], Tool]:
    """Declare a tool from a typed async function whose first parameter is the context.

    Args:
        effect: what the tool does to the world; there is no default on purpose.
        key_ttl: how long the service remembers idempotency keys; required for
            ``keyed`` (a little below the service's own TTL, or
            :data:`NEVER_EXPIRES`), refused for other effects. A type checker
            sees both rules for a literal ``effect``; an effect chosen at run
            time passes ``key_ttl`` explicitly (``None`` when not keyed).
        needs_approval: ask the approver before each call.
        key_check: for ``keyed``: warn (:class:`KeyNotSent`) when a call returns
            without reading ``ctx.idempotency_key``; False for a tool that sends
            the key another way.
        lookup: async function taking the same parameters, answering whether an
            in-doubt call happened: ``Found(result)``, ``NOT_FOUND`` or ``UNKNOWN``.
        intends: async function taking the same parameters and returning the
            files the call will write; their hashes go into the attempt marker.
        name: the tool's name (default: the function's).
        description: what the model is told (default: the docstring).

    Raises:
        TypeError: a declaration that cannot work, with the fix: ``effect`` not
            an :class:`~durably.Effect`, a function that is not async or has no
            context parameter, a lookup or ``intends`` with other parameters.
        ValueError: ``key_ttl`` missing for ``keyed``, given for another
            effect, or not a positive duration.
    """
    if not isinstance(effect, Effect):
        raise TypeError(f"effect must be a durably.Effect, got {effect!r}")
    ttl = checked_key_ttl(effect, key_ttl, name)
    if not isinstance(key_check, bool):
        raise TypeError(f"key_check must be True or False, got {key_check!r}")

    def decorate(function: ToolFunction) -> Tool:
        if isinstance(function, Tool):
            raise TypeError(f"tool {function.name!r} is declared twice: keep one @durably.tool")
        if not inspect.iscoroutinefunction(function):
            raise TypeError(
                f"tool {getattr(function, '__name__', function)!r} must be an async function "
                "(async def)"
            )
        tool_name = name or function.__name__
        if effect is Effect.KEYED and key_ttl is None:
            checked_key_ttl(effect, key_ttl, tool_name, required=True)
        arguments, schema = _described(function, tool_name)
        fields = tuple(arguments.__struct_fields__)
        for role, helper in (("lookup", lookup), ("intends", intends)):
            if helper is not None:
                _check_helper(helper, role=role, tool_name=tool_name, fields=fields)
        return Tool(
            name=tool_name,
            description=description or inspect.getdoc(function) or tool_name,
            effect=effect,
            function=function,
            arguments=arguments,
            schema=schema,
            needs_approval=needs_approval,
            key_ttl=ttl,
            key_check=key_check,
            lookup=lookup,
            intends=intends,
        )

    return decorate


def checked_key_ttl(
    effect: Effect,
    key_ttl: timedelta | KeyLifetime | None,
    tool_name: str | None,
    *,
    required: bool = False,
) -> timedelta | None:
    """``key_ttl`` as the ladder reads it (None: for ever), checked against ``effect``.

    With ``required``, a ``keyed`` tool without one is refused (a decorator that
    learns the tool's name later passes it then).

    Raises:
        TypeError: ``key_ttl`` is not a ``timedelta`` or :data:`NEVER_EXPIRES`.
        ValueError: it is missing for ``keyed``, given for another effect, or not positive.
    """
    if key_ttl is None:
        if required and effect is Effect.KEYED:
            which = f"tool {tool_name!r}" if tool_name else "a keyed tool"
            raise ValueError(
                f"{which} is keyed but says nothing of how long its service remembers keys: "
                "pass key_ttl=timedelta(hours=23) (a little below the service's own TTL; "
                "Stripe keeps keys 24 hours), or key_ttl=durably.NEVER_EXPIRES if the "
                "service keeps them for ever"
            )
        return None
    if effect is not Effect.KEYED:
        raise ValueError("key_ttl only applies to tools with effect=Effect.KEYED")
    if key_ttl is NEVER_EXPIRES:
        return None
    if not isinstance(key_ttl, timedelta):
        raise TypeError(
            f"key_ttl must be a datetime.timedelta (or durably.NEVER_EXPIRES), got {key_ttl!r}"
        )
    if key_ttl <= timedelta(0):
        raise ValueError(
            f"key_ttl must be a positive duration, got {key_ttl}; a service that keeps no "
            "keys is not keyed: declare effect=Effect.WRITE"
        )
    return key_ttl


def _check_helper(
    helper: Callable[..., Any], *, role: str, tool_name: str, fields: tuple[str, ...]
) -> None:
    """Refuse a lookup or ``intends`` that cannot be called as ``helper(ctx, **arguments)``."""
    wanted = ", ".join(("ctx", *fields))
    where = f"the {role} of tool {tool_name!r}"
    call = getattr(helper, "__call__", None)  # noqa: B004 - an async __call__ counts too
    if not (inspect.iscoroutinefunction(helper) or inspect.iscoroutinefunction(call)):
        raise TypeError(f"{where} must be an async function ({role}({wanted}))")
    try:
        signature = inspect.signature(helper)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return
    try:
        signature.bind(None, **dict.fromkeys(fields))
    except TypeError as exc:
        have = ", ".join(signature.parameters)
        raise TypeError(
            f"{where} takes ({have}) but is called as {role}({wanted}): give it the "
            f"tool's parameters, the context first ({exc})"
        ) from exc


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
    _check_context_parameter(parameters, hints, tool_name)
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


def _check_context_parameter(
    parameters: list[inspect.Parameter], hints: dict[str, Any], tool_name: str
) -> None:
    """Refuse a tool function whose first parameter cannot be the context."""
    fix = (
        f"tool {tool_name!r} must take a ToolContext as its first parameter: "
        f"async def {tool_name}(ctx: durably.ToolContext, ...)"
    )
    if not parameters:
        raise TypeError(f"{fix}; it takes no parameter")
    first = parameters[0]
    if first.kind not in (first.POSITIONAL_ONLY, first.POSITIONAL_OR_KEYWORD):
        raise TypeError(f"{fix}; its first parameter {first.name!r} is not positional")
    hint = hints.get(first.name)
    if hint is None or hint is Any:
        return
    if not (isinstance(hint, type) and issubclass(ToolContext, hint)):
        raise TypeError(
            f"{fix}; its first parameter is {first.name}: {getattr(hint, '__name__', hint)}, "
            "which would be taken for the context and hidden from the model"
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
