"""Anthropic's Messages API as a durably :class:`~durably.Model`.

:class:`AnthropicModel` sends a :class:`~durably.ModelRequest` with
``anthropic.AsyncAnthropic().messages.create`` and turns the answer into a
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

Call IDs are Anthropic's (``toolu_...``). Anthropic returns a call's arguments
already parsed (``input``); durably stores the canonical serialisation
``json.dumps(input, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``
and sends it back parsed. Usage maps ``input_tokens``/``output_tokens`` and
``cache_read_input_tokens``/``cache_creation_input_tokens`` (cache read and write).

Transient failures (429, 5xx, 529 overloaded, timeouts, connection errors) are
retried inside :meth:`AnthropicModel.reply` (see :class:`Retry`); the client's
own retries are switched off. A reply cut off at ``max_tokens`` is a
``ModelError``: the run stays where it was and can be resumed with a larger
``max_tokens``.
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
    canonical_json,
    classify_sdk_error,
    parse_object,
    with_retries,
)

if TYPE_CHECKING:
    from anthropic import AsyncAnthropic
    from anthropic.types import Message

__all__ = ["DEFAULT_MODEL", "AnthropicModel", "Retry", "to_messages", "to_tools"]

DEFAULT_MODEL = "claude-haiku-4-5"
"""The model ``durably triage`` uses when only ``ANTHROPIC_API_KEY`` is set: a current
model whose list price the price table knows."""

_PROVIDER = "anthropic"
_KEY_ENV = "ANTHROPIC_API_KEY"


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
    ) -> None:
        super().__init__(model, price=price, log=log, retry=retry)
        self.max_tokens = max_tokens
        self.client = _client(client)

    async def reply(self, request: ModelRequest) -> Reply:
        """Ask the model for ``request.turn``, retrying transient failures.

        Raises:
            ModelError: the provider failed in a way retrying did not fix, or the
                reply was cut off at ``max_tokens``.
        """
        import anthropic

        params: dict[str, Any] = {
            "model": self._model,
            "max_tokens": self.max_tokens,
            "messages": to_messages(request),
        }
        if request.system:
            params["system"] = request.system
        if request.tools:
            params["tools"] = to_tools(request.tools)

        def classify(exc: Exception) -> Failure | None:
            return classify_sdk_error(
                exc, sdk=anthropic, provider=_PROVIDER, key_env=_KEY_ENV, model=self._model
            )

        async def call() -> Message:
            # Without stream=True the answer is a whole response; the SDK's overloads
            # cannot see that through **params.
            return cast("Message", await self.client.messages.create(**params))

        message = await with_retries(call, provider=_PROVIDER, classify=classify, retry=self.retry)
        if self.log is not None:
            self.log.append(request.run_id, request.turn)
        return _to_reply(message, max_tokens=self.max_tokens)


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


def to_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Tool specs as Messages API tool definitions."""
    return [
        {"name": spec.name, "description": spec.description, "input_schema": spec.schema}
        for spec in tools
    ]


def _to_reply(message: Message, *, max_tokens: int) -> Reply:
    if message.stop_reason == "max_tokens":
        raise ModelError(
            provider=_PROVIDER,
            reason=f"the reply was cut off at max_tokens={max_tokens}",
            remedy="build the model with a larger max_tokens and resume the run",
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
