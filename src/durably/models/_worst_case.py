"""Worst-case pricing: the most one model call can cost, priced before it is made.

A model may say what a request can use at most through an optional
``usage_bound(request) -> Usage`` method; otherwise the bound is the request's size
(a token is at least one byte) plus the model's ``max_output_tokens`` (or
``max_tokens``) attribute. ``durably.models`` re-exports every name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgspec

from .._values import describe
from ..errors import ModelError
from ..state import Usage
from ._seam import Model, ModelRequest, Price, UsageBound, usage_problem

__all__ = ["WorstCase", "priced", "request_tokens_bound", "sized_worst_case", "worst_case"]


@dataclass(frozen=True, kw_only=True)
class WorstCase:
    """The most one model call can cost, priced before it is made."""

    dollars: float
    usage: Usage
    """The bound on each kind of token."""
    bounded: bool
    """False when the model declares no output limit: ``dollars`` then prices the input only."""


_FRAMING_TOKENS = 1024
"""Tokens a provider adds around a request (role markers, the tool-use preamble that
Anthropic documents at a few hundred tokens), counted generously."""
_TOKENS_PER_MESSAGE = 16


def request_tokens_bound(request: ModelRequest) -> int:
    """An upper bound on the input tokens of ``request``.

    Byte-level BPE tokenizers (those of Anthropic and OpenAI) never make a token
    of less than one byte, so a request's UTF-8 size, here as JSON (which only
    adds bytes), bounds its tokens; framing is added on top.
    """
    size = len(request.system.encode()) + len((request.summary or "").encode())
    size += len(msgspec.json.encode(list(request.messages)))
    size += len(msgspec.json.encode([(t.name, t.description, t.schema) for t in request.tools]))
    return size + _FRAMING_TOKENS + _TOKENS_PER_MESSAGE * len(request.messages)


def worst_case(model: Model, request: ModelRequest) -> WorstCase:
    """The most answering ``request`` can cost at ``model``'s price.

    Raises:
        ModelError: the model's ``usage_bound`` or ``dollars`` gave something that
            is not a count of tokens or an amount.
    """
    name = _model_name(model)
    bounded = True
    if isinstance(model, UsageBound):
        usage = model.usage_bound(request)
        if not isinstance(usage, Usage) or usage_problem(usage):
            raise ModelError(
                provider=name,
                reason=f"usage_bound returned {describe(usage)}, not a durably.Usage of counts",
                remedy="fix the model adapter's usage_bound",
            )
        dollars = priced(model, usage)
    else:
        inputs = request_tokens_bound(request)
        limit = getattr(model, "max_output_tokens", None) or getattr(model, "max_tokens", None)
        outputs = limit if type(limit) is int and limit > 0 else 0
        bounded = outputs > 0
        # The bound does not know how the provider will bill the input (fresh, cache
        # write, cache read): price it all at the dearest of the three.
        candidates = [
            Usage(input_tokens=inputs, output_tokens=outputs),
            Usage(cache_write_tokens=inputs, output_tokens=outputs),
            Usage(cache_read_tokens=inputs, output_tokens=outputs),
        ]
        prices = [priced(model, u) for u in candidates]
        dollars = max(prices)
        usage = candidates[prices.index(dollars)]
    return WorstCase(dollars=dollars, usage=usage, bounded=bounded)


def sized_worst_case(size: int, *, max_output_tokens: int, price: Price | None) -> WorstCase:
    """The worst case a front end prices from a request's ``size`` in bytes.

    A token is at least one byte, so ``size`` plus the provider's framing bounds the
    input; the output is ``max_output_tokens`` (0: no limit, so not ``bounded``). The
    input is priced at the dearest way it may be billed (fresh, cache write or read).
    """
    usage = Usage(input_tokens=size + _FRAMING_TOKENS, output_tokens=max_output_tokens)
    bounded = max_output_tokens > 0
    if price is None:
        return WorstCase(dollars=0.0, usage=usage, bounded=bounded)
    dearest = max(price.input, price.cache_write, price.cache_read)
    dollars = (usage.input_tokens * dearest + usage.output_tokens * price.output) / 1e6
    return WorstCase(dollars=dollars, usage=usage, bounded=bounded)


def priced(model: Model, usage: Usage) -> float:
    """``model.dollars(usage)``, refused unless it is an amount durably can store.

    Raises:
        ModelError: the price is not a finite amount of 0 or more.
    """
    dollars = model.dollars(usage)
    if (
        isinstance(dollars, bool)
        or not isinstance(dollars, int | float)
        or not math.isfinite(dollars)
        or dollars < 0
    ):
        raise ModelError(
            provider=_model_name(model),
            reason=f"model.dollars returned {describe(dollars)}, not an amount of 0 or more",
            remedy="fix the model adapter's dollars()",
        )
    return float(dollars)


def _model_name(model: Model) -> str:
    name = getattr(model, "name", None)
    return name if isinstance(name, str) else type(model).__name__
