"""Fake provider APIs on 127.0.0.1, answering from the triage task's recording.

:class:`FakeProvider` is a real HTTP server in a thread that speaks just enough
of Anthropic's ``POST /v1/messages`` or OpenAI's ``POST /v1/chat/completions``
for the official SDK clients. It answers turn ``n`` (one more than the number
of assistant turns in the request) with the recorded reply for turn ``n``,
converted into the provider's response JSON, or into its stream of
server-sent events when the request asks for ``stream``; a test can queue
error responses to be served before a turn's answer. Every request is kept,
with its headers and JSON body.

With ``cache=True`` the fake keeps a prompt cache the way the provider does
(:class:`PromptCache`): it remembers the prefixes requests sent, by the hash
of their exact content, and reports the tokens a later request reads from it
in the provider's usage fields.
"""

from __future__ import annotations

import hashlib
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


ANTHROPIC_MINIMUM = {"claude-haiku-4-5": 4096, "claude-opus-4-5": 4096}
"""Anthropic's shortest cacheable prefix, where it is not 1024 tokens (its prompt-caching
guide, "Cache limitations": 4096 for Claude Haiku 4.5 and Opus 4.5, 1024 for Sonnet 4.5)."""
OPENAI_MINIMUM = 1024
"""OpenAI caches prompts of 1024 tokens or more, in steps of 128 (its prompt-caching guide)."""
OPENAI_STEP = 128


@dataclass(frozen=True)
class CacheUse:
    """What one request read from and wrote to the fake's prompt cache."""

    turn: int
    prompt: int
    """Every input token of the request, cached or not."""
    read: int
    written: int


def _unit(value: Any) -> bytes:
    """One piece of a prompt, as exactly as the request sent it, less the cache marks."""
    if isinstance(value, dict):
        value = {k: v for k, v in value.items() if k != "cache_control"}
    return json.dumps(value, ensure_ascii=False).encode()


def anthropic_units(body: dict[str, Any]) -> tuple[list[bytes], list[bool]]:
    """The prompt's blocks in the order Anthropic caches them (tools, system, messages),
    and which carry a cache breakpoint.
    """
    units: list[bytes] = []
    marks: list[bool] = []
    system = body.get("system")
    blocks: list[Any] = list(body.get("tools", ()))
    blocks += [{"type": "text", "text": system}] if isinstance(system, str) else system or []
    for block in blocks:
        units.append(_unit(block))
        marks.append(isinstance(block, dict) and "cache_control" in block)
    for message in body["messages"]:
        content = message["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        for block in content:
            units.append(message["role"].encode() + b":" + _unit(block))
            marks.append("cache_control" in block)
    return units, marks


def openai_units(body: dict[str, Any]) -> list[bytes]:
    """The prompt's pieces in order: the tools first, then each message as sent."""
    return [_unit(body.get("tools"))] + [_unit(m) for m in body["messages"]]


@dataclass
class PromptCache:
    """A provider's prompt cache: prefix hashes and their token counts.

    A prefix is every unit of a request up to a boundary, hashed from the exact
    bytes sent (the cache marks aside), so one changed byte anywhere before the
    boundary is a miss. A prefix's tokens are the request's input tokens shared
    out by bytes, except the whole prompt, which has them all; a prefix seen
    before keeps the count it was stored with. Anthropic reads only at the
    request's breakpoints (stricter than the real lookback over earlier blocks)
    and writes from the end of what it read to the last breakpoint; OpenAI reads
    the longest prefix it has seen at any message boundary, in steps of 128
    tokens from 1024, and charges nothing to write.
    """

    provider: str
    minimum: int
    known: dict[str, int] = field(default_factory=dict)
    uses: list[CacheUse] = field(default_factory=list)

    def account(self, turn: int, body: dict[str, Any], prompt: int) -> tuple[int, int]:
        """(read, written) tokens for a request of ``prompt`` input tokens; remembers it."""
        if self.provider == "anthropic":
            units, marks = anthropic_units(body)
            seed = b""
        else:
            units, marks = openai_units(body), []
            seed = str(body.get("prompt_cache_key")).encode()  # routing: another key, a miss
        hashes, tokens = self._prefixes(seed, units, prompt)
        if self.provider == "anthropic":
            read, written = self._anthropic(hashes, tokens, marks)
        else:
            read, written = self._openai(hashes, tokens)
        self.uses.append(CacheUse(turn=turn, prompt=prompt, read=read, written=written))
        return read, written

    def _prefixes(
        self, seed: bytes, units: list[bytes], prompt: int
    ) -> tuple[list[str], list[int]]:
        total = sum(len(u) for u in units) or 1
        digest = hashlib.sha256(seed)
        hashes: list[str] = []
        tokens: list[int] = []
        size = 0
        for number, unit in enumerate(units, start=1):
            digest.update(len(unit).to_bytes(8, "big") + unit)
            size += len(unit)
            key = digest.hexdigest()
            hashes.append(key)
            whole = number == len(units)
            tokens.append(self.known.get(key, prompt if whole else prompt * size // total))
        return hashes, tokens

    def _anthropic(
        self, hashes: list[str], tokens: list[int], marks: list[bool]
    ) -> tuple[int, int]:
        points = [i for i, marked in enumerate(marks) if marked]
        read = max((tokens[i] for i in points if hashes[i] in self.known), default=0)
        written = 0
        if points and hashes[points[-1]] not in self.known and tokens[points[-1]] >= self.minimum:
            written = tokens[points[-1]] - read
        for i in points:
            if tokens[i] >= self.minimum:
                self.known[hashes[i]] = tokens[i]
        return read, written

    def _openai(self, hashes: list[str], tokens: list[int]) -> tuple[int, int]:
        seen = max((tokens[i] for i, h in enumerate(hashes) if h in self.known), default=0)
        read = seen // OPENAI_STEP * OPENAI_STEP if seen >= self.minimum else 0
        for key, count in zip(hashes, tokens, strict=True):
            if count >= self.minimum:
                self.known.setdefault(key, count)
        return read, 0


def prompt_tokens(provider: str, answer: dict[str, Any]) -> int:
    """Every input token an answer's usage counts, cached or not."""
    usage = answer["usage"]
    if provider == "openai":
        return int(usage["prompt_tokens"])
    return int(
        usage["input_tokens"]
        + (usage.get("cache_read_input_tokens") or 0)
        + (usage.get("cache_creation_input_tokens") or 0)
    )


def with_cache(provider: str, answer: dict[str, Any], read: int, written: int) -> dict[str, Any]:
    """``answer`` with its usage saying what was read from and written to the cache."""
    answer = json.loads(json.dumps(answer))
    usage = answer["usage"]
    prompt = prompt_tokens(provider, answer)
    if provider == "openai":
        usage["prompt_tokens_details"] = {"cached_tokens": read}
    else:
        usage["input_tokens"] = prompt - read - written
        usage["cache_read_input_tokens"] = read
        usage["cache_creation_input_tokens"] = written
    return answer


def pieces(text: str, size: int) -> list[str]:
    """``text`` in pieces of ``size`` characters, as a model streams it."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def anthropic_events(message: dict[str, Any], size: int) -> list[tuple[str, dict[str, Any]]]:
    """A Messages API response as its stream of (event, data), in the API's order.

    A ``tool_use`` block may carry ``partial_json``: the argument text streamed
    instead of its ``input`` (a reply cut off in the middle of a call).
    """
    usage = dict(message["usage"])
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**usage, "output_tokens": 1}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            opening: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in pieces(block["text"], size)]
        else:
            opening = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            raw = block.get("partial_json", json.dumps(block["input"], ensure_ascii=False))
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in pieces(raw, size)]
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": opening},
            )
        )
        events += [
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
            for d in deltas
        ]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    stop = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": stop,
                "usage": {"output_tokens": usage["output_tokens"]},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def openai_events(completion: dict[str, Any], size: int) -> list[tuple[str, dict[str, Any]]]:
    """A Chat Completions response as its stream of chunks, usage last (``include_usage``)."""
    choice = completion["choices"][0]
    message = choice["message"]
    frame = {k: completion[k] for k in ("id", "created", "model")}
    frame["object"] = "chat.completion.chunk"

    def chunk(delta: dict[str, Any], finish: str | None = None) -> tuple[str, dict[str, Any]]:
        choices = [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
        return "", {**frame, "choices": choices}

    chunks = [chunk({"role": "assistant", "content": ""})]
    if message.get("refusal"):
        chunks += [chunk({"refusal": p}) for p in pieces(message["refusal"], size)]
    if message.get("content"):
        chunks += [chunk({"content": p}) for p in pieces(message["content"], size)]
    for index, call in enumerate(message.get("tool_calls") or ()):
        function = call["function"]
        head = {"index": index, "id": call["id"], "type": "function"}
        chunks.append(
            chunk(
                {"tool_calls": [{**head, "function": {"name": function["name"], "arguments": ""}}]}
            )
        )
        chunks += [
            chunk({"tool_calls": [{"index": index, "function": {"arguments": p}}]})
            for p in pieces(function["arguments"], size)
        ]
    chunks.append(chunk({}, choice["finish_reason"]))
    chunks.append(("", {**frame, "choices": [], "usage": completion.get("usage")}))
    return chunks


def sse(provider: str, events: list[tuple[str, dict[str, Any]]], *, done: bool) -> list[bytes]:
    """Server-sent events as the provider frames them (OpenAI ends with ``[DONE]``)."""
    framed = [
        (f"event: {name}\n" if name else "").encode()
        + b"data: "
        + json.dumps(data, ensure_ascii=False).encode()
        + b"\n\n"
        for name, data in events
    ]
    if provider == "openai" and done:
        framed.append(b"data: [DONE]\n\n")
    return framed


STREAM_ERROR = {"stream-error": True}
"""A queued answer's body that makes the fake fail in the middle of a stream (an error event)."""
STREAM_CUT = {"stream-cut": True}
"""A queued answer's body that makes the fake close the connection in the middle of a stream."""


def mid_stream(
    provider: str, answer: dict[str, Any], body: dict[str, Any], size: int, error: dict[str, Any]
) -> list[bytes]:
    """Half a stream, then an error event (``error`` is the provider's error body), or nothing."""
    events = (
        anthropic_events(answer, size) if provider == "anthropic" else openai_events(answer, size)
    )
    half = events[: len(events) // 2]
    if body.get("stream-cut"):
        return sse(provider, half, done=False)
    if provider == "anthropic":
        return sse(provider, [*half, ("error", error)], done=False)
    return sse(provider, [*half, ("", error)], done=False)


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
    """Turn -> error responses served, in order, before that turn's answer (a 200 with
    :data:`STREAM_ERROR` or :data:`STREAM_CUT` as its body fails in the middle of a stream)."""
    cache: PromptCache | None = None
    """The prompt cache, when the fake keeps one."""
    piece: int = 12
    """Characters per streamed piece of text or arguments."""
    seen: list[Seen] = field(default_factory=list)
    streamed: int = 0
    """Streams sent to the end."""
    broken: int = 0
    """Streams the client went away from before their end."""
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

    def respond(self, path: str, headers: dict[str, str], raw: str) -> Answer | list[bytes]:
        """A JSON answer (status, body, headers), or the frames of a stream."""
        body = json.loads(raw)
        turn = turn_of(self.provider, body)
        with self._lock:
            self.seen.append(Seen(path=path, headers=headers, body=body, raw=raw))
            if path != PATHS[self.provider]:
                return 404, error_body(self.provider, 404, f"no route {path}"), {}
            waiting = self.errors.get(turn)
            failure = waiting.pop(0) if waiting else None
        if failure is not None and not (failure[0] == 200 and body.get("stream")):
            return failure
        answer = self.answer(turn)
        if self.cache is not None:
            with self._lock:
                read, written = self.cache.account(turn, body, prompt_tokens(self.provider, answer))
            answer = with_cache(self.provider, answer, read, written)
        if not body.get("stream"):
            return 200, answer, {}
        if failure is not None:
            error = error_body(
                self.provider, 529 if self.provider == "anthropic" else 500, "overloaded"
            )
            return mid_stream(self.provider, answer, failure[1], self.piece, error)
        if self.provider == "anthropic":
            return sse(self.provider, anthropic_events(answer, self.piece), done=True)
        return sse(self.provider, openai_events(answer, self.piece), done=True)


@contextmanager
def serving(fake: FakeProvider) -> Iterator[FakeProvider]:
    """Run ``fake`` on a free loopback port for the duration of the block."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            raw = self.rfile.read(length).decode()
            headers = {k.lower(): v for k, v in self.headers.items()}
            answer = fake.respond(self.path, headers, raw)
            if isinstance(answer, list):
                self.stream(answer)
                return
            status, body, extra = answer
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for name, value in extra.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def stream(self, frames: list[bytes]) -> None:
            # HTTP/1.0 with no length: the body ends when the connection closes.
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            try:
                for frame in frames:
                    self.wfile.write(frame)
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                fake.broken += 1
                return
            fake.streamed += 1

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


def m1_fake(provider: str, *, cache: bool = True, model: str | None = None) -> FakeProvider:
    """A fake answering m1 from its recording, with a prompt cache by default."""
    name = model or (ANTHROPIC_MODEL if provider == "anthropic" else OPENAI_MODEL)
    minimum = ANTHROPIC_MINIMUM.get(name, 1024) if provider == "anthropic" else OPENAI_MINIMUM
    return FakeProvider(
        provider,
        recorded_answer(provider, recorded_turns()),
        cache=PromptCache(provider, minimum) if cache else None,
    )


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
