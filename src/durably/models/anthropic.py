"""Anthropic's Messages API as a durably :class:`~durably.Model`.

:class:`AnthropicModel` sends a :class:`~durably.ModelRequest` through
``anthropic.AsyncAnthropic().messages`` and turns the answer into a
:class:`~durably.Reply`. The ``anthropic`` package is imported when a model is
built, never by ``import durably`` (install the ``durably[anthropic]`` extra).

How durably's conversation maps to the Messages API:

- the system prompt goes in ``system``; the context policy's summary, when
  there is one, is the first user message, before the saved messages;
- a user message is a ``text`` block; an assistant reply is its ``text`` block
  and one ``tool_use`` block per call, under the call's saved ID; tool results
  are ``tool_result`` blocks (with ``is_error``) in the user turn that follows;
  consecutive blocks of one role are merged into one turn, as the API requires;
- tools are sent with their JSON Schema as ``input_schema``.

Prompt caching (``cache=True``, the default) marks three cache breakpoints
(``cache_control``), of the four the API allows: the end of the tools and
system prompt, the end of the previous turn's request (its last block, which
this request repeats), and the end of this request. Each turn therefore reads
everything the previous turn sent from the cache and writes only what is new.
The request is built from the saved state alone, so a resumed run sends the
same bytes the dead process sent and still hits the cache.

Streaming (``stream=True``, the default) hands text and tool-call arguments to
``request.on_delta`` as they arrive; the reply is returned whole, when the
stream has ended, and only then can the loop save it.

Call IDs are Anthropic's (``toolu_...``). Anthropic returns a call's arguments
already parsed (``input``); durably stores the canonical serialisation
``json.dumps(input, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``
and sends it back parsed. Usage maps ``input_tokens``/``output_tokens`` and
``cache_read_input_tokens``/``cache_creation_input_tokens`` (cache read and write).

Transient failures (429, 5xx, 529 overloaded, an error event mid-stream,
timeouts, connection errors) are retried inside :meth:`AnthropicModel.reply`
(see :class:`Retry`); the client's own retries are switched off. A reply cut
off at ``max_tokens`` (even in the middle of a call's arguments), refused
(``stop_reason`` ``refusal``) or stopped by the context window is a
``ModelError``: nothing of it is saved, and the run can be resumed once the
cause is fixed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from ..errors import ModelError
from ..state import AssistantMessage, ToolResult, Usage, UserMessage
from . import Call, CallLog, Delta, ModelRequest, Price, Reply, ToolSpec
from ._provider import (
    CONTEXT_REMEDY,
    SUMMARY_INTRO,
    Failure,
    ProviderModel,
    Retry,
    StreamCut,
    canonical_json,
    classify_sdk_error,
    cut_off,
    parse_object,
    refused,
    with_retries,
)

if TYPE_CHECKING:
    from anthropic import AsyncAnthropic
    from anthropic.types import Message

__all__ = [
    "DEFAULT_MODEL",
    "AnthropicModel",
    "Retry",
    "cache_breakpoints",
    "to_messages",
    "to_tools",
]

DEFAULT_MODEL = "claude-haiku-4-5"
"""The model ``durably triage`` uses when only ``ANTHROPIC_API_KEY`` is set: a current
model whose list price the price table knows."""

_PROVIDER = "anthropic"
_KEY_ENV = "ANTHROPIC_API_KEY"
_EPHEMERAL = {"type": "ephemeral"}


class AnthropicModel(ProviderModel):
    """A Claude model behind Anthropic's Messages API.

    Args:
        model: the model name, e.g. ``claude-haiku-4-5``.
        client: an ``anthropic.AsyncAnthropic`` (default: one reading
            ``ANTHROPIC_API_KEY`` and ``ANTHROPIC_BASE_URL``); its retries are
            switched off, durably retries instead.
        max_tokens: the most tokens one reply may have.
        price: dollars per million tokens (default: the price table; a model
            not in it must be priced here).
        log: a :class:`~durably.CallLog` (or its path) recording every call paid for.
        retry: how transient failures are retried.
        cache: mark prompt-cache breakpoints, so each turn reads the last one's prefix.
        stream: stream the reply, handing its pieces to ``request.on_delta``.

    Raises:
        ModelError: the model has no known price, or no credentials were found.
    """

    provider = _PROVIDER

    def __init__(
        self,
        model: str,
        *,
        client: AsyncAnthropic | None = None,
        max_tokens: int = 4096,
        price: Price | None = None,
        log: CallLog | str | os.PathLike[str] | None = None,
        retry: Retry | None = None,
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
                reply was cut off at ``max_tokens``.
        """
        import anthropic

        messages = to_messages(request)
        tools = to_tools(request.tools)
        system: list[dict[str, Any]] = (
            [{"type": "text", "text": request.system}] if request.system else []
        )
        if self.cache:
            cache_breakpoints(tools, system, messages)
        params: dict[str, Any] = {
            "model": self._model,
            "max_tokens": self.max_tokens,
            "messages": messages,
        }
        if system:
            params["system"] = system
        if tools:
            params["tools"] = tools

        def classify(exc: Exception) -> Failure | None:
            return classify_sdk_error(
                exc, sdk=anthropic, provider=_PROVIDER, key_env=_KEY_ENV, model=self._model
            )

        async def call() -> Message:
            if self.stream:
                return await _streamed(self.client, params, request.on_delta)
            # Without stream=True the answer is a whole response; the SDK's overloads
            # cannot see that through **params.
            return cast("Message", await self.client.messages.create(**params))

        message = await with_retries(call, provider=_PROVIDER, classify=classify, retry=self.retry)
        if self.log is not None:
            self.log.append(request.run_id, request.turn)
        return _to_reply(message, max_tokens=self.max_tokens)


async def _streamed(
    client: AsyncAnthropic, params: dict[str, Any], on_delta: Callable[[Delta], None] | None
) -> Message:
    """The whole message, read from a stream whose pieces go to ``on_delta`` as they come."""
    calls: dict[int, tuple[str, str]] = {}
    async with client.messages.stream(**params) as stream:
        async for event in stream:
            if on_delta is None:
                continue
            if event.type == "content_block_start" and event.content_block.type == "tool_use":
                calls[event.index] = (event.content_block.id, event.content_block.name)
            elif event.type == "content_block_delta":
                if event.delta.type == "text_delta":
                    on_delta(Delta(text=event.delta.text))
                elif event.delta.type == "input_json_delta" and event.index in calls:
                    call_id, tool = calls[event.index]
                    on_delta(Delta(text=event.delta.partial_json, call_id=call_id, tool=tool))
        message = await stream.get_final_message()
    if message.stop_reason is None:
        raise StreamCut("it ended without a stop_reason")
    return message


def _client(client: AsyncAnthropic | None) -> AsyncAnthropic:
    try:
        import anthropic
    except ImportError as exc:
        raise ModelError(
            provider=_PROVIDER,
            reason="the anthropic package is not installed",
            remedy="install durably with the extra: pip install 'durably[anthropic]'",
        ) from exc
    if client is None:
        client = anthropic.AsyncAnthropic(max_retries=0)
        credentials = ("api_key", "auth_token", "credentials")
        if all(getattr(client, name, None) is None for name in credentials):
            raise ModelError(
                provider=_PROVIDER,
                reason="no API key found",
                remedy=f"set {_KEY_ENV} to your Anthropic API key, or use --model replay",
            )
        return client
    return client.with_options(max_retries=0)


def to_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The request's summary and messages as Messages API turns."""
    turns: list[dict[str, Any]] = []

    def add(role: str, block: dict[str, Any]) -> None:
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].append(block)
        else:
            turns.append({"role": role, "content": [block]})

    if request.summary:
        add("user", {"type": "text", "text": SUMMARY_INTRO + request.summary})
    for message in request.messages:
        if isinstance(message, UserMessage):
            add("user", {"type": "text", "text": message.text})
        elif isinstance(message, AssistantMessage):
            if message.text:
                add("assistant", {"type": "text", "text": message.text})
            for call in message.calls:
                add(
                    "assistant",
                    {
                        "type": "tool_use",
                        "id": call.id,
                        "name": call.name,
                        "input": parse_object(call.arguments),
                    },
                )
        elif isinstance(message, ToolResult):
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.call_id}
            if message.content:
                block["content"] = message.content
            if message.is_error:
                block["is_error"] = True
            add("user", block)
    return turns


def cache_breakpoints(
    tools: list[dict[str, Any]], system: list[dict[str, Any]], messages: list[dict[str, Any]]
) -> None:
    """Mark the request's prompt-cache breakpoints (``cache_control``), in place.

    Three of the four the API allows: the end of the tools and system prompt
    (they never change within a run); the last block of the user turn before the
    last assistant turn, which is where the previous turn's request ended (so a
    reply with many calls, more blocks than the API looks back over, still
    finds it); and the last block of the request. The marks themselves are not
    part of what is cached, so moving them from turn to turn keeps the prefix.
    """
    static = system[-1] if system else (tools[-1] if tools else None)
    if static is not None:
        static["cache_control"] = dict(_EPHEMERAL)
    if not messages:
        return
    assistants = [i for i, turn in enumerate(messages) if turn["role"] == "assistant"]
    if assistants and assistants[-1] > 0:
        messages[assistants[-1] - 1]["content"][-1]["cache_control"] = dict(_EPHEMERAL)
    messages[-1]["content"][-1]["cache_control"] = dict(_EPHEMERAL)


def to_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Tool specs as Messages API tool definitions."""
    return [
        {"name": spec.name, "description": spec.description, "input_schema": spec.schema}
        for spec in tools
    ]


def _to_reply(message: Message, *, max_tokens: int) -> Reply:
    stop = message.stop_reason
    if stop == "max_tokens":
        last = message.content[-1] if message.content else None
        partial = (last.id, last.name) if last is not None and last.type == "tool_use" else None
        raise cut_off(
            _PROVIDER, limit=f"max_tokens={max_tokens}", partial=partial, knob="max_tokens"
        )
    if stop == "refusal":
        raise refused(_PROVIDER, detail="stop_reason 'refusal'")
    if stop == "model_context_window_exceeded":
        raise ModelError(
            provider=_PROVIDER,
            reason="the reply was cut off by the model's context window "
            "(stop_reason 'model_context_window_exceeded')",
            remedy=CONTEXT_REMEDY,
        )
    texts: list[str] = []
    calls: list[Call] = []
    for block in message.content:
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "tool_use":
            calls.append(Call(block.id, block.name, canonical_json(block.input)))
    usage = message.usage
    return Reply(
        text="".join(texts) or None,
        calls=calls,
        usage=Usage(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_read_tokens=usage.cache_read_input_tokens or 0,
            cache_write_tokens=usage.cache_creation_input_tokens or 0,
        ),
        model=message.model,
    )
