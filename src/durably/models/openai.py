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

Prompt caching is OpenAI's own: automatic, for the longest prefix of at least
1024 tokens it has seen recently. What durably adds is a stable prefix (the
request is built from the saved state alone, so a resumed run sends the bytes
the dead process sent) and, with ``cache=True`` (the default), a
``prompt_cache_key`` derived from the model, system prompt and tools, so that
every turn of every run of one agent is routed to where that prefix is cached.
The key is a hash: it carries no run ID and nothing the model sees.

Streaming (``stream=True``, the default) asks for server-sent events with the
usage in the last chunk (``stream_options.include_usage``), hands text and
each call's argument string to ``request.on_delta`` as they arrive, and
returns the reply whole when the stream has ended.

Call IDs are OpenAI's (``call_...``). OpenAI returns a call's arguments as a
string, which durably keeps verbatim, even when it is not valid JSON (the loop
answers such a call with an error result). Usage maps ``prompt_tokens`` less
the cached and cache-written ones to input tokens, ``completion_tokens`` to
output, ``prompt_tokens_details.cached_tokens`` to cache reads and
``prompt_tokens_details.cache_write_tokens`` (when reported) to cache writes,
so that no token is counted twice.

Transient failures (429, 5xx, an error mid-stream, timeouts, connection
errors) are retried inside :meth:`OpenAIModel.reply` (see :class:`Retry`); the
client's own retries are switched off. A reply cut off by the length limit
(even in the middle of a call's arguments), stopped by the content filter or
refused by the model is a ``ModelError``; nothing of it is saved and the run
stays where it was.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ModelError
from ..state import AssistantMessage, ToolResult, Usage, UserMessage
from . import Call, CallLog, Delta, ModelRequest, Price, Reply, ToolSpec
from ._provider import (
    SUMMARY_INTRO,
    Failure,
    ProviderModel,
    Retry,
    StreamCut,
    canonical_json,
    classify_sdk_error,
    cut_off,
    refused,
    with_retries,
)

if TYPE_CHECKING:
    from openai import AsyncOpenAI
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    from openai.types.completion_usage import CompletionUsage

__all__ = [
    "DEFAULT_MODEL",
    "ERROR_PREFIX",
    "OpenAIModel",
    "Retry",
    "cache_key",
    "to_messages",
    "to_tools",
]

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
        max_tokens: the most tokens one reply may have (sent as
            ``max_completion_tokens``; default: the model's own limit).
        cache: send a ``prompt_cache_key`` derived from the agent's fixed prefix.
        stream: stream the reply, handing its pieces to ``request.on_delta``.

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
        max_tokens: int | None = None,
        cache: bool = True,
        stream: bool = True,
    ) -> None:
        super().__init__(model, price=price, log=log, retry=retry)
        self.max_tokens = max_tokens
        self.cache = cache
        self.stream = stream
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
        if self.max_tokens is not None:
            params["max_completion_tokens"] = self.max_tokens
        if self.cache:
            params["prompt_cache_key"] = cache_key(self._model, request)
        if self.stream:
            params["stream"] = True
            params["stream_options"] = {"include_usage": True}

        def classify(exc: Exception) -> Failure | None:
            return classify_sdk_error(
                exc, sdk=openai, provider=_PROVIDER, key_env=_KEY_ENV, model=self._model
            )

        async def call() -> _Answer:
            if self.stream:
                return await _streamed(self.client, params, request.on_delta)
            return _whole(await self.client.chat.completions.create(**params))

        answer = await with_retries(call, provider=_PROVIDER, classify=classify, retry=self.retry)
        if self.log is not None:
            self.log.append(request.run_id, request.turn)
        return self._to_reply(answer)

    def _to_reply(self, answer: _Answer) -> Reply:
        limit = "its length limit" if self.max_tokens is None else f"max_tokens={self.max_tokens}"
        if answer.finish_reason == "length":
            last = answer.calls[-1] if answer.calls else None
            partial = (last.id, last.name) if last is not None else None
            raise cut_off(_PROVIDER, limit=limit, partial=partial, knob="max_tokens")
        if answer.finish_reason == "content_filter":
            raise refused(_PROVIDER, detail="finish_reason 'content_filter'")
        if answer.refusal:
            raise refused(_PROVIDER, detail=f"the model said: {answer.refusal[:200]}")
        return Reply(
            text=answer.text or None,
            calls=answer.calls,
            usage=_usage(answer.usage),
            model=answer.model,
        )


def cache_key(model: str, request: ModelRequest) -> str:
    """The ``prompt_cache_key`` of a request: a hash of what every turn of the agent shares.

    The model, the system prompt and the tools (in the order they are sent) never
    change within a run, nor between the runs of one agent, which share that prefix.
    """
    tools = [(t.name, t.description, canonical_json(t.schema)) for t in request.tools]
    fixed = canonical_json([model, request.system, tools])
    return "durably-" + hashlib.sha256(fixed.encode()).hexdigest()[:32]


@dataclass
class _Answer:
    """A completion's first choice, whether it came whole or as a stream."""

    text: str = ""
    refusal: str = ""
    calls: list[Call] = field(default_factory=list)
    finish_reason: str | None = None
    usage: CompletionUsage | None = None
    model: str | None = None


def _whole(completion: ChatCompletion) -> _Answer:
    if not completion.choices:
        raise ModelError(
            provider=_PROVIDER,
            reason="the response has no choices",
            remedy="resume the run to ask again",
        )
    choice = completion.choices[0]
    answer = _Answer()
    answer.text = choice.message.content or ""
    answer.refusal = choice.message.refusal or ""
    answer.finish_reason = choice.finish_reason
    answer.usage = completion.usage
    answer.model = completion.model
    for tool_call in choice.message.tool_calls or ():
        if tool_call.type != "function":
            raise _not_a_function(tool_call.type)
        answer.calls.append(
            Call(tool_call.id, tool_call.function.name, tool_call.function.arguments)
        )
    return answer


def _not_a_function(kind: str | None) -> ModelError:
    return ModelError(
        provider=_PROVIDER,
        reason=f"the reply holds a {kind!r} tool call, not a function call",
        remedy="use only function tools with this model",
    )


async def _streamed(
    client: AsyncOpenAI, params: dict[str, Any], on_delta: Callable[[Delta], None] | None
) -> _Answer:
    """The first choice, put together from a stream whose pieces go to ``on_delta``.

    Each call's argument string is the concatenation of its pieces, byte for byte.
    """
    answer = _Answer()
    calls: dict[int, list[str]] = {}  # index -> [id, name, arguments so far]
    stream = await client.chat.completions.create(**params)
    async with stream:
        async for chunk in stream:
            _take(chunk, answer, calls, on_delta)
    if answer.finish_reason is None:
        raise StreamCut("it ended without a finish_reason")
    answer.calls = [Call(*calls[index]) for index in sorted(calls)]
    return answer


def _take(  # noqa: C901 - one branch per kind of stream event the SDK sends
    chunk: ChatCompletionChunk,
    answer: _Answer,
    calls: dict[int, list[str]],
    on_delta: Callable[[Delta], None] | None,
) -> None:
    answer.model = chunk.model
    if chunk.usage is not None:
        answer.usage = chunk.usage
    for choice in chunk.choices:
        if choice.index != 0:
            continue
        delta = choice.delta
        if choice.finish_reason is not None:
            answer.finish_reason = choice.finish_reason
        if delta.refusal:
            answer.refusal += delta.refusal
        if delta.content:
            answer.text += delta.content
            if on_delta is not None:
                on_delta(Delta(text=delta.content))
        for piece in delta.tool_calls or ():
            if piece.type not in (None, "function"):
                raise _not_a_function(piece.type)
            call = calls.setdefault(piece.index, ["", "", ""])
            function = piece.function
            if piece.id:
                call[0] = piece.id
            if function is not None and function.name:
                call[1] = function.name
            if function is not None and function.arguments:
                call[2] += function.arguments
                if on_delta is not None:
                    on_delta(Delta(text=function.arguments, call_id=call[0], tool=call[1]))


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


def _usage(usage: CompletionUsage | None) -> Usage:
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
