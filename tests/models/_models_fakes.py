"""Fake provider APIs on 127.0.0.1, answering from the triage task's recording.

:class:`FakeProvider` is a real HTTP server in a thread that speaks just enough
of Anthropic's ``POST /v1/messages`` or OpenAI's ``POST /v1/chat/completions``
for the official SDK clients. It answers turn ``n`` (one more than the number
of assistant turns in the request) with the recorded reply for turn ``n``,
converted into the provider's response JSON; a test can queue error responses
to be served before a turn's answer. Every request is kept, with its headers and JSON body.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from durably.models import CallLog, Model
from durably.models.anthropic import AnthropicModel
from durably.models.openai import OpenAIModel
from durably.models.replay import RecordedTurn, load_recording
from durably.triage.agent import recording_path

M1 = "m1-done-after-delete"
SECRET = "sk-test-0123456789-never-record-me"  # noqa: S105 -- a fake key, to find leaks
"""The API key the tests hand the SDK clients; it must never reach a file."""
PATHS = {"anthropic": "/v1/messages", "openai": "/v1/chat/completions"}
ANTHROPIC_MODEL = "claude-haiku-4-5"
OPENAI_MODEL = "gpt-4.1"

Answer = tuple[int, dict[str, Any], dict[str, str]]
"""An HTTP status, a JSON body and extra headers."""


def recorded_turns(task: str = M1) -> list[RecordedTurn]:
    """The recorded replies of a bundled triage task."""
    return load_recording(recording_path(task)).turns


def openai_call_id(recorded_id: str) -> str:
    """The OpenAI-style call ID the fake gives a recorded call."""
    return "call_" + recorded_id.removeprefix("toolu_")


def anthropic_message(turn: RecordedTurn, number: int) -> dict[str, Any]:
    """A recorded turn as a Messages API response."""
    content: list[dict[str, Any]] = []
    if turn.text:
        content.append({"type": "text", "text": turn.text})
    for call in turn.calls:
        content.append(
            {
                "type": "tool_use",
                "id": call.id,
                "name": call.name,
                "input": json.loads(call.arguments),
            }
        )
    return {
        "id": f"msg_fake{number:04d}",
        "type": "message",
        "role": "assistant",
        "model": f"{ANTHROPIC_MODEL}-20251001",
        "content": content,
        "stop_reason": "tool_use" if turn.calls else "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": turn.usage.input_tokens,
            "output_tokens": turn.usage.output_tokens,
            "cache_read_input_tokens": turn.usage.cache_read_tokens,
            "cache_creation_input_tokens": turn.usage.cache_write_tokens,
        },
    }


def openai_completion(turn: RecordedTurn, number: int) -> dict[str, Any]:
    """A recorded turn as a Chat Completions response (arguments kept as recorded)."""
    message: dict[str, Any] = {"role": "assistant", "content": turn.text}
    if turn.calls:
        message["tool_calls"] = [
            {
                "id": openai_call_id(call.id),
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in turn.calls
        ]
    prompt = turn.usage.input_tokens + turn.usage.cache_read_tokens
    return {
        "id": f"chatcmpl-fake{number:04d}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": f"{OPENAI_MODEL}-2025-04-14",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if turn.calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": turn.usage.output_tokens,
            "total_tokens": prompt + turn.usage.output_tokens,
            "prompt_tokens_details": {"cached_tokens": turn.usage.cache_read_tokens},
        },
    }


def error_body(provider: str, status: int, message: str) -> dict[str, Any]:
    """An error response body in the provider's shape."""
    if provider == "anthropic":
        kind = {401: "authentication_error", 429: "rate_limit_error", 529: "overloaded_error"}
        return {
            "type": "error",
            "error": {"type": kind.get(status, "api_error"), "message": message},
        }
    return {"error": {"message": message, "type": "error", "param": None, "code": None}}


@dataclass(frozen=True)
class Seen:
    """One request the fake received."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    raw: str


def turn_of(provider: str, body: dict[str, Any]) -> int:
    """Which turn a request asks for: one more than the assistant turns it carries."""
    return 1 + sum(1 for m in body.get("messages", ()) if m.get("role") == "assistant")


def recorded_answer(provider: str, turns: list[RecordedTurn]) -> Callable[[int], dict[str, Any]]:
    """Answers turn ``n`` with the ``n``-th recorded turn, in the provider's shape."""
    convert = anthropic_message if provider == "anthropic" else openai_completion
    return lambda number: convert(turns[number - 1], number)


@dataclass
class FakeProvider:
    """A provider API on 127.0.0.1 that answers each turn from a script."""

    provider: str
    answer: Callable[[int], dict[str, Any]]
    errors: dict[int, list[Answer]] = field(default_factory=dict)
    """Turn -> error responses served, in order, before that turn's answer."""
    seen: list[Seen] = field(default_factory=list)
    port: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def base_url(self) -> str:
        """What the SDK client is given as ``base_url``."""
        root = f"http://127.0.0.1:{self.port}"
        return root if self.provider == "anthropic" else f"{root}/v1"

    def turns(self) -> list[int]:
        """The turn each request asked for, in order of arrival."""
        return [turn_of(self.provider, s.body) for s in self.seen]

    def respond(self, path: str, headers: dict[str, str], raw: str) -> Answer:
        body = json.loads(raw)
        with self._lock:
            self.seen.append(Seen(path=path, headers=headers, body=body, raw=raw))
            if path != PATHS[self.provider]:
                return 404, error_body(self.provider, 404, f"no route {path}"), {}
            waiting = self.errors.get(turn_of(self.provider, body))
            if waiting:
                return waiting.pop(0)
        return 200, self.answer(turn_of(self.provider, body)), {}


@contextmanager
def serving(fake: FakeProvider) -> Iterator[FakeProvider]:
    """Run ``fake`` on a free loopback port for the duration of the block."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            raw = self.rfile.read(length).decode()
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, body, extra = fake.respond(self.path, headers, raw)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for name, value in extra.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output clean

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    fake.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def provider_model(
    provider: str,
    base_url: str,
    *,
    log: CallLog | str | os.PathLike[str] | None = None,
    **options: Any,
) -> Model:
    """A real SDK client pointed at ``base_url``, wrapped in durably's adapter."""
    if provider == "anthropic":
        import anthropic

        client = anthropic.AsyncAnthropic(api_key=SECRET, base_url=base_url)
        return AnthropicModel(ANTHROPIC_MODEL, client=client, log=log, **options)
    import openai

    openai_client = openai.AsyncOpenAI(api_key=SECRET, base_url=base_url)
    return OpenAIModel(OPENAI_MODEL, client=openai_client, log=log, **options)


async def close(model: Model) -> None:
    """Close the SDK client inside ``model`` (found through a recorder, if any)."""
    inner = getattr(model, "inner", model)
    client = getattr(inner, "client", None)
    if client is not None:
        await client.close()
