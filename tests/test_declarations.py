"""A user's own mistake in declaring an agent fails where it is made, naming the fix (issue 32)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import durably
from durably import Effect, ToolContext


def model() -> durably.ScriptedModel:
    """A model that answers at once."""
    return durably.ScriptedModel([durably.Reply(text="done")])


async def refund(ctx: ToolContext, order_id: str, cents: int) -> str:
    """Refund an order (the function every case below declares)."""
    return f"refunded {order_id} {cents} ({ctx.idempotency_key})"


def test_a_tool_function_without_a_context_parameter_is_refused_at_declaration() -> None:
    """``async def refund(order_id, cents)`` is refused, not taken with ``order_id`` as the
    context (the model's first call failed with ``unknown field 'order_id'``).
    """

    async def no_ctx(order_id: str, cents: int) -> str:
        return order_id

    with pytest.raises(TypeError, match=r"must take a ToolContext.*order_id: str"):
        durably.tool(effect=Effect.WRITE)(no_ctx)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("async def f(ctx, order_id: str): pass", "takes \\(ctx, order_id\\)"),
        ("async def f(ctx, order: str, cents: int): pass", "takes \\(ctx, order, cents\\)"),
        ("async def f(order_id: str, cents: int): pass", "takes \\(order_id, cents\\)"),
        ("def f(ctx, order_id: str, cents: int): pass", "must be an async function"),
    ],
)
def test_a_lookup_whose_parameters_differ_from_the_tools_is_refused(
    source: str, message: str
) -> None:
    """A lookup that could not be called with the tool's arguments (a missing or misnamed
    parameter, no context, not async) is refused at declaration, not found out in a crash
    recovery where it counted as UNKNOWN and a person was asked.
    """
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # noqa: S102 - each case is a function definition
    with pytest.raises(TypeError, match=f"lookup of tool 'refund' {message}|{message}"):
        durably.tool(effect=Effect.WRITE, lookup=namespace["f"])(refund)


def test_intends_whose_parameters_differ_from_the_tools_is_refused() -> None:
    """``intends`` is called like the tool: other parameters are refused at declaration, while
    a lookup or ``intends`` taking the tool's parameters, or ``**arguments``, is accepted.
    """

    async def files(ctx: ToolContext, path: str) -> dict[str, str]:
        return {}

    with pytest.raises(TypeError, match="intends of tool 'refund' takes \\(ctx, path\\)"):
        durably.tool(effect=Effect.IDEMPOTENT, intends=files)(refund)

    async def exact(ctx: ToolContext, order_id: str, cents: int) -> durably.Lookup:
        return durably.UNKNOWN

    async def loose(ctx: ToolContext, **arguments: object) -> durably.Lookup:
        return durably.UNKNOWN

    for lookup in (exact, loose):
        assert durably.tool(effect=Effect.WRITE, lookup=lookup)(refund).lookup is lookup


def test_a_keyed_tool_must_say_how_long_its_service_keeps_keys() -> None:
    """``keyed`` without ``key_ttl`` is refused (it silently meant "for ever"); the message
    names the fix, and ``NEVER_EXPIRES`` says "for ever" by name.
    """
    with pytest.raises(ValueError, match=r"'refund' is keyed.*key_ttl=durably.NEVER_EXPIRES"):
        durably.tool(effect=Effect.KEYED)(refund)  # type: ignore[call-overload]
    forever = durably.tool(effect=Effect.KEYED, key_ttl=durably.NEVER_EXPIRES)(refund)
    day = durably.tool(effect=Effect.KEYED, key_ttl=timedelta(hours=23))(refund)
    assert (forever.key_ttl, day.key_ttl) == (None, timedelta(hours=23))


@pytest.mark.parametrize(
    ("ttl", "error", "message"),
    [
        (3600, TypeError, "must be a datetime.timedelta"),
        (timedelta(0), ValueError, "positive duration"),
        (timedelta(hours=-1), ValueError, "positive duration"),
    ],
)
def test_a_key_ttl_of_the_wrong_kind_is_refused(
    ttl: Any, error: type[Exception], message: str
) -> None:
    """A ``key_ttl`` in seconds, zero or negative is refused, naming what it must be."""
    with pytest.raises(error, match=message):
        durably.tool(effect=Effect.KEYED, key_ttl=ttl)(refund)


def test_an_http_tool_that_is_keyed_must_say_how_long_keys_are_kept() -> None:
    """``http_tool(effect=KEYED)`` without ``key_ttl`` is refused as ``@tool`` is."""
    import msgspec

    from durably.transports import http_tool

    class Order(msgspec.Struct):
        item: str

    with pytest.raises(ValueError, match="'place_order' is keyed"):
        http_tool(
            name="place_order",
            description="Place an order.",
            method="POST",
            url="http://shop/orders",
            effect=Effect.KEYED,
            arguments=Order,
        )


def test_a_plain_function_among_the_tools_is_refused_naming_the_decorator() -> None:
    """A function never declared with ``@durably.tool`` is a TypeError naming the fix, not
    ``AttributeError: 'function' object has no attribute 'name'``.
    """
    with pytest.raises(TypeError, match=r"tools\[0\] is 'refund', a plain function.*@durably.tool"):
        durably.Agent(model=model(), tools=[refund])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="tools must be a list"):
        durably.Agent(model=model(), tools=durably.tool(effect=Effect.READ)(refund))  # type: ignore[arg-type]


def test_two_tools_of_one_name_are_refused() -> None:
    """Two tools named alike are refused (the second silently replaced the first)."""
    first = durably.tool(effect=Effect.READ)(refund)
    second = durably.tool(effect=Effect.WRITE)(refund)
    with pytest.raises(ValueError, match="two tools are named 'refund'"):
        durably.Agent(model=model(), tools=[first, second])


def test_a_model_given_by_name_is_refused_naming_how_to_build_it() -> None:
    """``Agent(model="anthropic")`` fails when built, naming ``choose_model``, not at run time."""
    with pytest.raises(TypeError, match=r"choose_model\('anthropic'\)"):
        durably.Agent(model="anthropic", tools=[])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"must be a durably\.Model"):
        durably.Agent(model=object(), tools=[])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_dollars": "2"}, "Limits.max_dollars must be a number"),
        ({"max_turns": 2.5}, "Limits.max_turns must be a whole number"),
        ({"max_tokens": "1000"}, "Limits.max_tokens must be a whole number"),
        ({"max_resumes": None}, "Limits.max_resumes must be a whole number"),
        ({"max_turns": True}, "Limits.max_turns must be a whole number"),
    ],
)
def test_limits_of_the_wrong_type_are_refused_naming_the_field(
    fields: dict[str, Any], message: str
) -> None:
    """A limit of the wrong type is a TypeError naming the field, not a raw comparison error."""
    with pytest.raises(TypeError, match=message):
        durably.Limits(**fields)


def test_a_tool_needing_approval_without_an_approver_is_refused() -> None:
    """No approver and a ``needs_approval`` tool is refused, naming the three approvers;
    approving everything must be chosen by name (``PolicyApprover``).
    """
    asked = durably.tool(effect=Effect.WRITE, needs_approval=True)(refund)
    with pytest.raises(TypeError) as refused:
        durably.Agent(model=model(), tools=[asked])
    for name in ("TerminalApprover", "AskLater", "PolicyApprover", "'refund'"):
        assert name in str(refused.value)
    durably.Agent(model=model(), tools=[asked], approver=durably.PolicyApprover())
    durably.Agent(model=model(), tools=[durably.tool(effect=Effect.WRITE)(refund)])


def test_an_approver_that_cannot_answer_is_refused() -> None:
    """An approver without ``approve`` and ``resolve`` is refused at construction."""
    with pytest.raises(TypeError, match="approver must answer"):
        durably.Agent(model=model(), tools=[], approver=object())  # type: ignore[arg-type]
