"""Choosing a model from a short spec and the environment (``durably triage --model``).

Specs:

``anthropic:MODEL`` / ``anthropic``
    Anthropic's Messages API (default model :data:`durably.models.anthropic.DEFAULT_MODEL`),
    with ``ANTHROPIC_API_KEY`` (and ``ANTHROPIC_BASE_URL`` if set).
``openai:MODEL`` / ``openai``
    OpenAI's Chat Completions (default model :data:`durably.models.openai.DEFAULT_MODEL`),
    with ``OPENAI_API_KEY`` (and ``OPENAI_BASE_URL`` if set).
``replay``
    The recorded run at ``recording``; no network, no key.
``auto`` or None
    ``ANTHROPIC_API_KEY`` set: Anthropic's default model; else ``OPENAI_API_KEY``
    set: OpenAI's default model; else ``replay``.

Keys are read from ``environ`` (default ``os.environ``) and handed to the
client; they are never stored or recorded.

A model missing from the price table (:mod:`durably.models._pricing`) needs a
price: pass ``price=``, or set ``DURABLY_PRICE`` to dollars per million tokens
as ``INPUT,OUTPUT`` or ``INPUT,OUTPUT,CACHE_READ,CACHE_WRITE`` (for example
``DURABLY_PRICE=3,15``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..errors import ModelError
from . import CallLog, Model, Price

__all__ = ["PRICE_ENV", "SPECS", "choose_model", "parse_price", "resolve_spec"]

PRICE_ENV = "DURABLY_PRICE"
"""The environment variable that prices a model the price table does not know."""

SPECS = "replay, auto, anthropic[:MODEL] or openai[:MODEL]"
"""What :func:`choose_model` accepts, for messages."""

_KEYS = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}
_BASE_URLS = {"anthropic": "ANTHROPIC_BASE_URL", "openai": "OPENAI_BASE_URL"}


def resolve_spec(spec: str | None, *, environ: Mapping[str, str] = os.environ) -> tuple[str, str]:
    """The provider and model a spec stands for: ``("replay", "")`` or ``(provider, model)``.

    Raises:
        ModelError: the spec is not one of :data:`SPECS`.
    """
    from .anthropic import DEFAULT_MODEL as ANTHROPIC_DEFAULT
    from .openai import DEFAULT_MODEL as OPENAI_DEFAULT

    defaults = {"anthropic": ANTHROPIC_DEFAULT, "openai": OPENAI_DEFAULT}
    spec = (spec or "auto").strip()
    if spec == "auto":
        for provider, key in _KEYS.items():
            if environ.get(key):
                return provider, defaults[provider]
        return "replay", ""
    if spec == "replay":
        return "replay", ""
    provider, _, model = spec.partition(":")
    if provider not in defaults or (spec.endswith(":") and not model):
        raise ModelError(
            provider="durably",
            reason=f"unknown model {spec!r}",
            remedy=f"use one of {SPECS}, e.g. anthropic:{ANTHROPIC_DEFAULT}",
        )
    return provider, model or defaults[provider]


def choose_model(
    spec: str | None,
    *,
    recording: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] = os.environ,
    log: CallLog | str | os.PathLike[str] | None = None,
    record_to: str | os.PathLike[str] | None = None,
    price: Price | None = None,
) -> Model:
    """The model a spec names, ready to use.

    Args:
        spec: see the module's documentation; None means ``auto``.
        recording: the replay file, used when the spec resolves to ``replay``.
        environ: where API keys and base URLs are read.
        log: a :class:`~durably.CallLog` (or its path) recording every model call.
        record_to: wrap a provider model in a
            :class:`~durably.models.recorder.RecordingModel` writing this file.
        price: the provider model's price (default: ``DURABLY_PRICE`` in
            ``environ``, else the price table).

    Raises:
        ModelError: an unknown spec, a missing key or package, a model with no
            known price, a malformed ``DURABLY_PRICE``, or ``replay`` without a
            recording.
    """
    provider, model = resolve_spec(spec, environ=environ)
    if provider == "replay":
        if recording is None:
            raise ModelError(
                provider="replay",
                reason="no recording to replay",
                remedy="pass the recording's path, or name a provider model",
            )
        from .replay import ReplayModel

        return ReplayModel(recording, log=log)

    key = environ.get(_KEYS[provider])
    if not key:
        raise ModelError(
            provider=provider,
            reason=f"{_KEYS[provider]} is not set",
            remedy=f"set {_KEYS[provider]} to your API key, or use --model replay",
        )
    base_url = environ.get(_BASE_URLS[provider]) or None
    if price is None and environ.get(PRICE_ENV):
        price = parse_price(environ[PRICE_ENV])
    chosen: Model
    if provider == "anthropic":
        chosen = _anthropic(model, key=key, base_url=base_url, log=log, price=price)
    else:
        chosen = _openai(model, key=key, base_url=base_url, log=log, price=price)
    if record_to is not None:
        from .recorder import RecordingModel

        chosen = RecordingModel(chosen, record_to)
    return chosen


def parse_price(text: str) -> Price:
    """A price written ``INPUT,OUTPUT[,CACHE_READ,CACHE_WRITE]`` in dollars per million tokens.

    Raises:
        ModelError: the text is not two or four non-negative numbers.
    """
    try:
        figures = [float(part) for part in text.split(",")]
    except ValueError:
        figures = []
    if len(figures) not in (2, 4) or any(f < 0 for f in figures):
        raise ModelError(
            provider="durably",
            reason=f"{PRICE_ENV}={text!r} is not a price",
            remedy=(
                f"write {PRICE_ENV} as INPUT,OUTPUT or INPUT,OUTPUT,CACHE_READ,CACHE_WRITE "
                "in dollars per million tokens, e.g. 3,15"
            ),
        )
    if len(figures) == 2:
        return Price(input=figures[0], output=figures[1])
    return Price(input=figures[0], output=figures[1], cache_read=figures[2], cache_write=figures[3])


_Log = CallLog | str | os.PathLike[str] | None


def _anthropic(
    model: str, *, key: str, base_url: str | None, log: _Log, price: Price | None
) -> Model:
    from .anthropic import AnthropicModel

    try:
        import anthropic
    except ImportError:
        # Raises the ModelError that says to install the extra.
        return AnthropicModel(model, log=log, price=price)
    client = anthropic.AsyncAnthropic(api_key=key, base_url=base_url, max_retries=0)
    return AnthropicModel(model, client=client, log=log, price=price)


def _openai(model: str, *, key: str, base_url: str | None, log: _Log, price: Price | None) -> Model:
    from .openai import OpenAIModel

    try:
        import openai
    except ImportError:
        # Raises the ModelError that says to install the extra.
        return OpenAIModel(model, log=log, price=price)
    client = openai.AsyncOpenAI(api_key=key, base_url=base_url, max_retries=0)
    return OpenAIModel(model, client=client, log=log, price=price)
