"""List prices of the provider models durably knows, in dollars per million tokens.

Where the figures come from: the providers' published list prices for their
standard (not batch, not priority) tiers, as given on anthropic.com/pricing
and openai.com/api/pricing. Only models whose prices we are sure of are
listed, which leaves out the newest ones (newer Claude and GPT-5.x models,
for example): those must be priced explicitly, with ``price=`` or the
``DURABLY_PRICE`` environment variable (see :mod:`durably.models.select`),
because a run's dollar limit is only as good as its price. Prices change: when
a provider changes one, change it here, and pass ``price=`` meanwhile.

Notes on the figures:

- Anthropic: ``cache_write`` is the 5-minute cache write (1.25 x input),
  ``cache_read`` the cache hit (0.1 x input): the "5m cache writes" and "cache
  hits & refreshes" columns of anthropic.com/pricing, and the multipliers of
  the prompt-caching guide (docs.anthropic.com, "Prompt caching", "Pricing").
  durably's breakpoints use the default 5-minute cache, never the 1-hour one
  (2 x input to write). Sonnet's long-context rate (prompts over 200k tokens)
  is not modelled; durably's runs stay far below it.
- OpenAI: ``cache_read`` is the "Cached input" column of openai.com/api/pricing.
  OpenAI does not charge extra for writing its cache (its prompt-caching guide:
  "no additional fees"), so ``cache_write`` equals ``input``.

Dated snapshots (``claude-sonnet-4-5-20250929``, ``gpt-4.1-2025-04-14``) are
priced as their alias, except snapshots known to differ (the first ``gpt-4o``).
"""

from __future__ import annotations

import re

from ..errors import ModelError
from . import Price

__all__ = ["ANTHROPIC", "OPENAI", "price_of"]

ANTHROPIC: dict[str, Price] = {
    "claude-opus-4-5": Price(input=5.0, output=25.0, cache_read=0.50, cache_write=6.25),
    "claude-sonnet-4-5": Price(input=3.0, output=15.0, cache_read=0.30, cache_write=3.75),
    "claude-haiku-4-5": Price(input=1.0, output=5.0, cache_read=0.10, cache_write=1.25),
}
"""Anthropic models by alias (the dated snapshot names resolve to these)."""

OPENAI: dict[str, Price] = {
    "gpt-4o": Price(input=2.50, output=10.0, cache_read=1.25, cache_write=2.50),
    "gpt-4o-mini": Price(input=0.15, output=0.60, cache_read=0.075, cache_write=0.15),
    "gpt-4.1": Price(input=2.0, output=8.0, cache_read=0.50, cache_write=2.0),
    "gpt-4.1-mini": Price(input=0.40, output=1.60, cache_read=0.10, cache_write=0.40),
    "gpt-4.1-nano": Price(input=0.10, output=0.40, cache_read=0.025, cache_write=0.10),
    "gpt-5": Price(input=1.25, output=10.0, cache_read=0.125, cache_write=1.25),
    "gpt-5-mini": Price(input=0.25, output=2.0, cache_read=0.025, cache_write=0.25),
    "gpt-5-nano": Price(input=0.05, output=0.40, cache_read=0.005, cache_write=0.05),
}
"""OpenAI models by alias (the dated snapshot names resolve to these)."""

_TABLES = {"anthropic": ANTHROPIC, "openai": OPENAI}

# Snapshots priced differently from their alias: never resolved to the alias.
_UNLIKE_ALIAS = frozenset({"gpt-4o-2024-05-13"})

# A trailing snapshot date: ``-20250929`` (Anthropic) or ``-2025-04-14`` (OpenAI).
_SNAPSHOT = re.compile(r"-(?:\d{8}|\d{4}-\d{2}-\d{2})$")


def price_of(provider: str, model: str, explicit: Price | None = None) -> Price:
    """The price of ``model``: ``explicit`` if given, else the table's.

    Raises:
        ModelError: the model is not in the table and no price was given; a run
            is never priced at zero by accident.
    """
    if explicit is not None:
        return explicit
    table = _TABLES[provider]
    found = table.get(model)
    if found is None and model not in _UNLIKE_ALIAS:
        found = table.get(_SNAPSHOT.sub("", model))
    if found is None:
        known = ", ".join(sorted(table))
        raise ModelError(
            provider=provider,
            reason=f"durably has no price for model {model!r} (it knows {known})",
            remedy=(
                "pass price=durably.Price(input=..., output=...) in dollars per million "
                "tokens, from the provider's price list"
            ),
        )
    return found
