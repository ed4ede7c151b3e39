"""Declaring tools: the schema from the type hints, refused declarations, shared descriptions."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

import durably
from durably import Effect
from durably.tools import Tool, ToolContext


def _factory(prefix: str) -> Tool:
    """One tool per call, as an agent builder makes them for every run."""

    @durably.tool(effect=Effect.READ)
    async def greet(ctx: ToolContext, name: str, times: int = 1) -> str:
        """Greets someone."""
        return f"{prefix} {name}" * times

    return greet


def test_the_schema_comes_from_the_type_hints() -> None:
    """A tool's argument schema comes from its type hints, defaults included."""
    tool = _factory("hi")
    assert tool.schema["properties"] == {
        "name": {"type": "string"},
        "times": {"type": "integer", "default": 1},
    }
    assert tool.schema["required"] == ["name"]
    assert tool.description == "Greets someone."


def test_tools_made_by_one_factory_share_a_description_but_not_its_dicts() -> None:
    """Tools made by one factory share their described arguments but never a mutable schema."""
    first, second = _factory("hi"), _factory("hello")
    assert first.arguments is second.arguments
    assert first.schema == second.schema
    first.schema["properties"]["name"]["type"] = "number"
    assert second.schema["properties"]["name"] == {"type": "string"}
    assert _factory("hey").schema["properties"]["name"] == {"type": "string"}


def test_functions_with_other_annotations_or_defaults_are_described_apart() -> None:
    """Functions with the same code but other annotations or defaults get their own description."""

    def make(kind: Any, default: object) -> Tool:
        async def pick(ctx: ToolContext, value: kind = default) -> str:
            return str(value)

        pick.__annotations__ = {"ctx": ToolContext, "value": kind, "return": str}
        return durably.tool(effect=Effect.READ)(pick)

    as_int, as_text = make(int, 1), make(str, "a")
    assert as_int.schema["properties"]["value"] == {"type": "integer", "default": 1}
    assert as_text.schema["properties"]["value"] == {"type": "string", "default": "a"}
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"value": "x"}', type=as_int.arguments)


def test_an_unhashable_default_is_described_every_time() -> None:
    """A default that cannot be hashed is described afresh each time, not from a cache."""

    @durably.tool(effect=Effect.READ)
    async def tags(ctx: ToolContext, names: list[str] = []) -> str:  # noqa: B006 - on purpose
        return ",".join(names)

    assert tags.schema["properties"]["names"]["type"] == "array"


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def f(ctx, x: int): pass", "must be an async function"),
        ("async def f(): pass", "must take a ToolContext"),
        ("async def f(ctx, *xs: int): pass", "cannot be described to a model"),
        ("async def f(ctx, x): pass", "needs a type hint"),
    ],
)
def test_declarations_a_model_cannot_call_are_refused(source: str, message: str) -> None:
    """A declaration a model cannot call (sync, no context, ``*args``, no hint) is a TypeError."""
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # noqa: S102 - each case is a function definition
    with pytest.raises(TypeError, match=message):
        durably.tool(effect=Effect.READ)(namespace["f"])
