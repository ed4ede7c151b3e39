"""OpenAI's Chat Completions API as a durably :class:`~durably.Model`.

:class:`OpenAIModel` sends a :class:`~durably.ModelRequest` with
``openai.AsyncOpenAI().chat.completions.create`` and turns the answer into a
:class:`~durably.Reply`. The ``openai`` package is imported when a model is
built, never by ``import durably`` (install the ``durably[openai]`` extra).

How durably's conversation maps to Chat Completions:

- the system prompt is a ``system`` message; the context policy's summary,
  when there is one, is the first user message after it;
- a user message is a ``user`` message; an assistant reply is an ``assistant``
  message with its text and one ``function`` tool call per call, under the
  call's saved ID and with its saved argument string, byte for byte; a tool
  result is a ``tool`` message answering ``tool_call_id``. Chat Completions has
  no error flag, so an error result's content is prefixed with ``Error: ``;
- tools are sent as ``function`` tools with their JSON Schema as ``parameters``.

Call IDs are OpenAI's (``call_...``). OpenAI returns a call's arguments as a
string, which durably keeps verbatim, even when it is not valid JSON (the loop
answers such a call with an error result). Usage maps ``prompt_tokens`` less
the cached and cache-written ones to input tokens, ``completion_tokens`` to
output, ``prompt_tokens_details.cached_tokens`` to cache reads and
``prompt_tokens_details.cache_write_tokens`` (when reported) to cache writes,
so that no token is counted twice.

Transient failures (429, 5xx, timeouts, connection errors) are retried inside
:meth:`OpenAIModel.reply` (see :class:`Retry`); the client's own retries are
switched off. A reply cut off by the length limit or the content filter is a
``ModelError``; the run stays where it was.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from ..errors import ModelError
from ..state import AssistantMessage, ToolResult, Usage, UserMessage
from . import Call, CallLog, ModelRequest, Price, Reply, ToolSpec
from ._provider import (
    SUMMARY_INTRO,
    Failure,
    ProviderModel,
    Retry,
    classify_sdk_error,
    with_retries,
)

if TYPE_CHECKING:
    from openai import AsyncOpenAI
    from openai.types.chat import ChatCompletion

__all__ = ["DEFAULT_MODEL", "ERROR_PREFIX", "OpenAIModel", "Retry", "to_messages", "to_tools"]

DEFAULT_MODEL = "gpt-4.1"
"""The model ``durably triage`` uses when only ``OPENAI_API_KEY`` is set (one the price
table knows; name a newer one with a price to use it)."""

ERROR_PREFIX = "Error: "
"""Opens the content of a tool result that is an error (Chat Completions has no flag)."""

_PROVIDER = "openai"
_KEY_ENV = "OPENAI_API_KEY"


class OpenAIModel(ProviderModel):
    """A model behind OpenAI's Chat Completions API.

    Args:
        model: the model name, e.g. ``gpt-4.1``.
        client: an ``openai.AsyncOpenAI`` (default: one reading ``OPENAI_API_KEY``
            and ``OPENAI_BASE_URL``); its retries are switched off, durably
            retries instead.
        price: dollars per million tokens (default: the price table; a model
            not in it must be priced here).
        log: a :class:`~durably.CallLog` (or its path) recording every call paid for.
        retry: how transient failures are retried.

    Raises:
        ModelError: the model has no known price, or no API key was found.
    """

    provider = _PROVIDER

    def __init__(
        self,
        model: str,
        *,
        client: AsyncOpenAI | None = None,
        price: Price | None = None,
        log: CallLog | str | os.PathLike[str] | None = None,
        retry: Retry | None = None,
    ) -> None:
        super().__init__(model, price=price, log=log, retry=retry)
        self.client = _client(client)

    async def reply(self, request: ModelRequest) -> Reply:
        """Ask the model for ``request.turn``, retrying transient failures.

        Raises:
            ModelError: the provider failed in a way retrying did not fix, or the
                reply was cut off.
        """
        import openai

        params: dict[str, Any] = {"model": self._model, "messages": to_messages(request)}
        if request.tools:
            params["tools"] = to_tools(request.tools)

        def classify(exc: Exception) -> Failure | None:
            return classify_sdk_error(
                exc, sdk=openai, provider=_PROVIDER, key_env=_KEY_ENV, model=self._model
            )

        async def call() -> ChatCompletion:
            # Without stream=True the answer is a whole response; the SDK's overloads
            # cannot see that through **params.
            return cast("ChatCompletion", await self.client.chat.completions.create(**params))

        completion = await with_retries(
            call, provider=_PROVIDER, classify=classify, retry=self.retry
        )
        if self.log is not None:
            self.log.append(request.run_id, request.turn)
        return _to_reply(completion)


def _client(client: AsyncOpenAI | None) -> AsyncOpenAI:
    try:
        import openai
    except ImportError as exc:
        raise ModelError(
            provider=_PROVIDER,
            reason="the openai package is not installed",
            remedy="install durably with the extra: pip install 'durably[openai]'",
        ) from exc
    if client is not None:
        return client.with_options(max_retries=0)
    try:
        return openai.AsyncOpenAI(max_retries=0)
    except openai.OpenAIError as exc:  # raised when no API key is configured
        raise ModelError(
            provider=_PROVIDER,
            reason=f"the client could not be built ({exc})",
            remedy=f"set {_KEY_ENV} to your OpenAI API key, or use --model replay",
        ) from exc


def to_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The request's system prompt, summary and messages as Chat Completions messages."""
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    if request.summary:
        messages.append({"role": "user", "content": SUMMARY_INTRO + request.summary})
    for message in request.messages:
        if isinstance(message, UserMessage):
            messages.append({"role": "user", "content": message.text})
        elif isinstance(message, AssistantMessage):
            out: dict[str, Any] = {"role": "assistant", "content": message.text}
            if message.calls:
                out["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                    for call in message.calls
                ]
            messages.append(out)
        elif isinstance(message, ToolResult):
            content = ERROR_PREFIX + message.content if message.is_error else message.content
            messages.append({"role": "tool", "tool_call_id": message.call_id, "content": content})
    return messages


def to_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Tool specs as Chat Completions function tools."""
    return [
        {
            "type": "function",
            "function": {
                "name": spec.name,
                "description": spec.description,
                "parameters": spec.schema,
            },
        }
        for spec in tools
    ]


def _to_reply(completion: ChatCompletion) -> Reply:
    if not completion.choices:
        raise ModelError(
            provider=_PROVIDER,
            reason="the response has no choices",
            remedy="resume the run to ask again",
        )
    choice = completion.choices[0]
    if choice.finish_reason in ("length", "content_filter"):
        raise ModelError(
            provider=_PROVIDER,
            reason=f"the reply was cut off (finish_reason={choice.finish_reason!r})",
            remedy="resume the run to ask again, or shorten the conversation",
        )
    calls: list[Call] = []
    for tool_call in choice.message.tool_calls or ():
        if tool_call.type != "function":
            raise ModelError(
                provider=_PROVIDER,
                reason=f"the reply holds a {tool_call.type!r} tool call, not a function call",
                remedy="use only function tools with this model",
            )
        calls.append(Call(tool_call.id, tool_call.function.name, tool_call.function.arguments))
    return Reply(
        text=choice.message.content or None,
        calls=calls,
        usage=_usage(completion),
        model=completion.model,
    )


def _usage(completion: ChatCompletion) -> Usage:
    usage = completion.usage
    if usage is None:
        return Usage()
    details = usage.prompt_tokens_details
    cached = (details.cached_tokens or 0) if details is not None else 0
    written = (getattr(details, "cache_write_tokens", None) or 0) if details is not None else 0
    return Usage(
        input_tokens=max(0, usage.prompt_tokens - cached - written),
        output_tokens=usage.completion_tokens,
        cache_read_tokens=cached,
        cache_write_tokens=written,
    )
