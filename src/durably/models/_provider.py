"""What the provider adapters share: retries, error translation, small codecs.

A model call has no side effect, so a transient failure (rate limit, overload,
timeout, a 5xx, an error event in the middle of a stream) is retried inside the
call, with exponential backoff and jitter, a bounded number of times, waiting
at least as long as the provider's ``retry-after`` asks. Everything else becomes
a :class:`~durably.ModelError` at once, with a remedy. The SDKs' own retries are
switched off (``max_retries=0``) so that this is the only retry and tests can
drive it with a fake sleep.

The errors a user meets in a long run each get their own remedy: a conversation
longer than the model's context window (a context policy), a reply refused by
the provider, and a reply cut off at the output limit, in the middle of a tool
call's arguments or not (the partial call is never run: nothing is saved).
"""

from __future__ import annotations

import email.utils
import json
import logging
import os
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from types import ModuleType
from typing import Any, ClassVar, TypeVar

from ..errors import ModelError
from ..state import Usage
from . import CallLog, Price
from ._pricing import price_of

log = logging.getLogger("durably.models")

__all__ = [
    "CONTEXT_REMEDY",
    "SUMMARY_INTRO",
    "Failure",
    "Retry",
    "StreamCut",
    "canonical_json",
    "classify_sdk_error",
    "cut_off",
    "parse_object",
    "refused",
    "with_retries",
]

SUMMARY_INTRO = (
    "Summary of the earlier part of this conversation (its messages were dropped to "
    "save context):\n\n"
)
"""Opens the user message that carries the context policy's summary."""


CONTEXT_REMEDY = (
    "give the agent a context policy that folds old history into a summary "
    "(Agent(context_policy=durably.ContextPolicy(max_messages=..., keep=...)), "
    "smaller than the conversation now), or use a model with a larger context window, "
    "then resume the run: it is saved as it was before this turn"
)
"""What to do when the conversation no longer fits the model."""

_SAVED = "the run is saved as it was before this turn"


def cut_off(provider: str, *, limit: str, partial: tuple[str, str] | None, knob: str) -> ModelError:
    """The error for a reply stopped by the output limit.

    Args:
        provider: the provider's name.
        limit: the limit as the request set it, e.g. ``max_tokens=4096``.
        partial: (call ID, tool name) of a call whose arguments were cut off, if any.
        knob: the adapter argument that raises the limit.
    """
    where = (
        f" in the middle of the arguments of call {partial[0]!r} to {partial[1]!r} "
        "(that call was not run)"
        if partial is not None
        else ""
    )
    return ModelError(
        provider=provider,
        reason=f"the reply was cut off at {limit}{where}",
        remedy=f"build the model with a larger {knob} and resume the run; {_SAVED}",
    )


def refused(provider: str, *, detail: str) -> ModelError:
    """The error for a reply the provider refused to give (a safety refusal, a content filter)."""
    return ModelError(
        provider=provider,
        reason=f"the provider refused to answer ({detail})",
        remedy=(
            "change the task or the tool results that triggered the refusal; resuming "
            f"asks again with the same conversation and is likely refused again; {_SAVED}"
        ),
    )


def canonical_json(value: Any) -> str:
    """One serialisation per value: sorted keys, no spaces, non-ASCII kept as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def parse_object(raw: str) -> dict[str, Any]:
    """A saved argument string as a JSON object; ``{}`` when it is not one.

    Arguments that are not an object never ran (the loop answered them with an
    error), so the provider is only told that the call carried nothing usable.
    """
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


_T = TypeVar("_T")


class StreamCut(Exception):
    """A stream ended before the reply did (the connection closed early): asked again."""


def _jitter(low: float, high: float) -> float:
    return random.uniform(low, high)  # noqa: S311 -- spreads retries out; not a secret


@dataclass(frozen=True, kw_only=True)
class Retry:
    """How a model adapter retries transient provider failures.

    The n-th wait is drawn between half and all of ``min(cap, base * 2**(n-1))``
    seconds, or is the provider's ``retry-after`` when that is longer (up to ``cap``).
    The waiting is stamina's (``stamina.retry_context``): its testing mode
    (``stamina.set_testing``) makes every wait zero, and its instrumentation sees
    each retry.
    """

    attempts: int = 5
    """Tries in all, the first included; at least 1."""
    base: float = 1.0
    cap: float = 30.0
    jitter: Callable[[float, float], float] = _jitter
    """Draws a number between its two arguments."""

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (from 1)."""
        ceiling = min(self.cap, self.base * 2 ** (attempt - 1))
        wait = self.jitter(ceiling / 2, ceiling)
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.cap))
        return wait


@dataclass(frozen=True, kw_only=True)
class Failure:
    """What a provider error means for the caller."""

    transient: bool
    reason: str
    remedy: str
    retry_after: float | None = None


async def with_retries(
    call: Callable[[], Awaitable[_T]],
    *,
    provider: str,
    classify: Callable[[Exception], Failure | None],
    retry: Retry,
) -> _T:
    """Await ``call()``, retrying transient failures; raise ``ModelError`` for the rest.

    Exceptions ``classify`` does not recognise (it returns None) propagate unchanged.
    """
    import stamina

    attempts = max(1, retry.attempts)
    tried = 0

    def backoff(exc: Exception) -> bool | float:
        # stamina's backoff hook: a float is the wait before the next try, False gives up.
        failure = classify(exc)
        if failure is None or not failure.transient or tried >= attempts:
            return False
        wait = retry.delay(tried, failure.retry_after)
        log.info("%s: %s; asking again in %.2f s", provider, failure.reason, wait)
        return wait

    try:
        async for attempt in stamina.retry_context(on=backoff, attempts=None, timeout=None):
            with attempt:
                tried = attempt.num
                return await call()
    except Exception as exc:
        failure = classify(exc)
        if failure is None:
            raise
        tries = f" (after {tried} attempts)" if failure.transient else ""
        raise ModelError(
            provider=provider, reason=failure.reason + tries, remedy=failure.remedy
        ) from exc
    raise AssertionError("unreachable: stamina ends with a return or an exception")


def _retry_after(exc: Any) -> float | None:
    """The wait the provider asked for, in seconds: ``retry-after-ms`` or ``retry-after``.

    ``retry-after`` may be seconds or an HTTP date (RFC 9110, section 10.2.3); OpenAI
    also sends ``retry-after-ms``, which the openai SDK prefers, and so do we.
    """
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


# Words with which the providers say a prompt is longer than the model's window:
# Anthropic "prompt is too long: N tokens > M maximum"; OpenAI code
# "context_length_exceeded", "maximum context length is N tokens".
_TOO_LONG = ("prompt is too long", "context_length_exceeded", "maximum context length")


def _error_body(exc: Any) -> tuple[str | None, str | None, str]:
    """(type, code, message) of a provider error body, whichever shape it has."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body = body["error"]  # Anthropic wraps it: {"type": "error", "error": {...}}
    if not isinstance(body, dict):
        return None, None, str(getattr(exc, "message", "") or exc)
    kind, code, message = body.get("type"), body.get("code"), body.get("message")
    return (
        kind if isinstance(kind, str) else None,
        code if isinstance(code, str) else None,
        message if isinstance(message, str) else str(getattr(exc, "message", "") or exc),
    )


def classify_sdk_error(  # noqa: C901, PLR0911 - a table of the SDK's error classes, one return each
    exc: Exception, *, sdk: ModuleType, provider: str, key_env: str, model: str
) -> Failure | None:
    """Classify an error raised by the ``anthropic`` or ``openai`` SDK (they share a shape).

    Args:
        exc: what the SDK raised.
        sdk: the SDK module, for its error classes.
        provider: the provider's name, for messages.
        key_env: the environment variable holding the API key, for remedies.
        model: the model asked for, for remedies.
    """
    wait = "the run's state is saved: resume it later"
    if isinstance(exc, sdk.APITimeoutError):
        return Failure(transient=True, reason="the request timed out", remedy=wait)
    if isinstance(exc, sdk.APIConnectionError):
        return Failure(
            transient=True,
            reason=f"could not reach the API ({exc})",
            remedy=f"check the network and the base URL; {wait}",
        )
    if isinstance(exc, StreamCut):
        return Failure(transient=True, reason=f"the stream was cut ({exc})", remedy=wait)
    if not isinstance(exc, sdk.APIError):
        return None
    kind, code, message = _error_body(exc)
    said = message[:300]
    mid_stream = not isinstance(exc, sdk.APIStatusError) or exc.status_code == 200
    status: int = 200 if mid_stream else exc.status_code
    if status in (200, 400, 413) and (
        code == "context_length_exceeded" or any(w in said.lower() for w in _TOO_LONG)
    ):
        return Failure(
            transient=False,
            reason=f"the conversation is longer than the model's context window ({said})",
            remedy=CONTEXT_REMEDY,
        )
    if mid_stream:
        # An error event in the middle of a stream: the HTTP status was 200 and the body
        # names the error (Anthropic "overloaded_error", OpenAI "server_error"). Only a
        # refusal of the request itself is final; anything else is the provider failing.
        if kind == "invalid_request_error":
            return Failure(
                transient=False,
                reason=f"the provider refused the request mid-stream ({said})",
                remedy="durably built a request the provider does not accept: report it",
            )
        return Failure(
            transient=True,
            reason=f"the stream failed ({kind or code or 'error'}: {said})",
            remedy=wait,
            retry_after=_retry_after(exc),
        )
    if status == 401:
        return Failure(
            transient=False,
            reason=f"the API key was refused (401: {said})",
            remedy=f"check the API key: set {key_env} to a valid key",
        )
    if status == 403:
        return Failure(
            transient=False,
            reason=f"permission denied (403: {said})",
            remedy=f"check that the API key in {key_env} may use model {model!r}",
        )
    if status == 404:
        return Failure(
            transient=False,
            reason=f"not found (404: {said})",
            remedy=f"check the model name {model!r} and the base URL",
        )
    if status == 429:
        return Failure(
            transient=True,
            reason=f"rate limited (429: {said})",
            remedy=f"lower the request rate or raise the account's limits; {wait}",
            retry_after=_retry_after(exc),
        )
    if status in (503, 529):
        return Failure(
            transient=True,
            reason=f"the provider is overloaded ({status}: {said})",
            remedy=wait,
            retry_after=_retry_after(exc),
        )
    if status == 408 or status == 409 or status >= 500:
        return Failure(
            transient=True,
            reason=f"the provider failed ({status}: {said})",
            remedy=wait,
            retry_after=_retry_after(exc),
        )
    return Failure(
        transient=False,
        reason=f"the provider refused the request ({status}: {said})",
        remedy=(
            "durably built a request the provider does not accept: report it with the "
            "run's checkpoint"
        ),
    )


class ProviderModel:
    """What every provider adapter shares: its name, its price, its call log, its retries.

    Raises:
        ModelError: the model has no known price and none was given.
    """

    provider: ClassVar[str]

    def __init__(
        self,
        model: str,
        *,
        price: Price | None,
        log: CallLog | str | os.PathLike[str] | None,
        retry: Retry | None,
    ) -> None:
        self._model = model
        self.price = price_of(self.provider, model, price)
        self.log = log if isinstance(log, CallLog) or log is None else CallLog(log)
        self.retry = retry or Retry()

    @property
    def name(self) -> str:
        """The model name, as configured (recorded in the run's fingerprint)."""
        return self._model

    def dollars(self, usage: Usage) -> float:
        """What ``usage`` costs at this model's price."""
        return self.price.dollars(usage)
