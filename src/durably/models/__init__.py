"""Models: the seam between the loop and whatever writes the replies.

A :class:`Model` takes a :class:`ModelRequest` (system prompt, the conversation,
the tool schemas, the turn number) and returns a :class:`Reply`: text, tool
calls with the model's call IDs and raw argument strings, and usage. A model
call has no side effect, so adapters may retry transient failures inside it.

A model that streams hands each piece of the reply, as it arrives, to the
request's ``on_delta`` as a :class:`Delta`; the reply it returns is still the
whole reply, and only that is saved. Pieces of an attempt that failed are not
taken back: a listener shows them, it never keeps them.

:class:`ScriptedModel` answers from a list given in code, by turn, so a resumed
run in a new process continues the script. It can log every call it answers to
a file, which is how tests count replies paid twice across processes.

Everything an adapter returns is user code's output: :func:`checked_reply`
refuses a reply of the wrong shape (a non-string call ID, negative usage, text
UTF-8 cannot encode) with a :class:`~durably.ModelError` naming the model and
the turn, before anything of it is saved.

Before each call the loop prices the call's worst case (:func:`worst_case`): a
model may say what a request can use at most through an optional
``usage_bound(request) -> Usage`` method; otherwise the bound is the request's
size (a token is at least one byte) plus the model's ``max_output_tokens`` (or
``max_tokens``) attribute.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import msgspec

from .._sysio import append_line
from .._values import describe, text_problem
from ..errors import ModelError
from ..state import Message, Usage

__all__ = [
    "Call",
    "CallLog",
    "Delta",
    "Model",
    "ModelRequest",
    "Price",
    "Reply",
    "ScriptedModel",
    "ToolSpec",
    "UsageBound",
    "WorstCase",
    "checked_reply",
    "worst_case",
]


@dataclass(frozen=True, kw_only=True)
class Price:
    """Dollars per million tokens, by kind of token."""

    input: float
    output: float
    cache_read: float = 0.0
    cache_write: float = 0.0

    def dollars(self, usage: Usage) -> float:
        """What ``usage`` costs at this price."""
        return (
            usage.input_tokens * self.input
            + usage.output_tokens * self.output
            + usage.cache_read_tokens * self.cache_read
            + usage.cache_write_tokens * self.cache_write
        ) / 1_000_000


@dataclass(frozen=True)
class Call:
    """One tool call in a reply: the model's call ID, the tool name, the raw argument string."""

    id: str
    name: str
    arguments: str = "{}"


@dataclass(frozen=True, kw_only=True)
class Reply:
    """One model response."""

    text: str | None = None
    calls: Sequence[Call] = ()
    usage: Usage = field(default_factory=Usage)
    model: str | None = None


@dataclass(frozen=True, kw_only=True)
class ToolSpec:
    """What the model is told about a tool."""

    name: str
    description: str
    schema: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Delta:
    """A piece of a reply, as the model writes it (streaming)."""

    text: str
    """The new characters: of the reply's text, or of one call's raw argument string."""
    call_id: str | None = None
    """The call whose arguments ``text`` continues; None for the reply's text."""
    tool: str | None = None
    """The called tool's name, with ``call_id``."""

    @property
    def kind(self) -> Literal["text-delta", "arguments-delta"]:
        """The loop's event kind for this piece: ``text-delta`` or ``arguments-delta``."""
        return "text-delta" if self.call_id is None else "arguments-delta"

    def data(self) -> dict[str, Any]:
        """The piece as an event's data."""
        if self.call_id is None:
            return {"text": self.text}
        return {"call_id": self.call_id, "tool": self.tool, "text": self.text}


@dataclass(frozen=True, kw_only=True)
class ModelRequest:
    """Everything a model needs for one turn."""

    run_id: str
    turn: int
    """The turn being asked for, counting from 1."""
    system: str
    messages: Sequence[Message]
    tools: Sequence[ToolSpec]
    summary: str | None = None
    """The context policy's summary of dropped history, to be sent before ``messages``."""
    on_delta: Callable[[Delta], None] | None = field(default=None, compare=False, repr=False)
    """Called with each piece of the reply as it streams in, when the model streams."""


@runtime_checkable
class Model(Protocol):
    """Anything that answers a :class:`ModelRequest` with a :class:`Reply`."""

    @property
    def name(self) -> str:
        """The model's name, recorded in the run's fingerprint."""
        ...

    async def reply(self, request: ModelRequest) -> Reply:
        """Answer one turn."""
        ...

    def dollars(self, usage: Usage) -> float:
        """What ``usage`` cost."""
        ...


@runtime_checkable
class UsageBound(Protocol):
    """A model that can say the most a request may use (optional, beside :class:`Model`)."""

    def usage_bound(self, request: ModelRequest) -> Usage:
        """The most tokens of each kind answering ``request`` can be billed for."""
        ...


def checked_reply(reply: object, *, model: str, turn: int) -> Reply:
    """``reply`` if it is a :class:`Reply` durably can store, else a clear :class:`ModelError`.

    Raises:
        ModelError: naming the model, the turn and the value that does not fit.
    """

    def refuse(what: str, problem: str) -> ModelError:
        return ModelError(
            provider=model,
            reason=f"the reply for turn {turn} is unusable: {what}: {problem}",
            remedy="fix the model adapter; nothing of this reply was saved, and resuming "
            "asks for it again",
        )

    if not isinstance(reply, Reply):
        return_type = describe(reply)
        raise refuse("model.reply returned", f"expected durably.Reply, got {return_type}")
    if reply.text is not None and (problem := text_problem(reply.text)):
        raise refuse("text", problem)
    if reply.model is not None and (problem := text_problem(reply.model)):
        raise refuse("model", problem)
    if isinstance(reply.calls, str | bytes) or not isinstance(reply.calls, Sequence):
        raise refuse("calls", f"expected a sequence of durably.Call, got {describe(reply.calls)}")
    for index, call in enumerate(reply.calls):
        if not isinstance(call, Call):
            raise refuse(f"calls[{index}]", f"expected durably.Call, got {describe(call)}")
        for name in ("id", "name", "arguments"):
            if problem := text_problem(getattr(call, name)):
                raise refuse(f"calls[{index}].{name}", problem)
    usage = reply.usage
    if not isinstance(usage, Usage):
        raise refuse("usage", f"expected durably.Usage, got {describe(usage)}")
    if problem := usage_problem(usage):
        raise refuse("usage", problem)
    return reply


def usage_problem(usage: Usage) -> str | None:
    """Why ``usage`` is not a count of tokens, or None when it is."""
    for name in usage.__struct_fields__:
        value = getattr(usage, name)
        if type(value) is not int or value < 0:
            return f"{name} must be a whole number of tokens, 0 or more, got {describe(value)}"
    return None


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


class _Asked(msgspec.Struct):
    """One line of a :class:`CallLog`."""

    run_id: str
    turn: int


_ASKED_LINES = msgspec.json.Decoder(_Asked)


class CallLog:
    """An append-only log of model calls, one JSON line per call, shared by processes.

    Each line is written with one ``write`` on an ``O_APPEND`` descriptor, so it
    survives the process being killed right after (the page cache keeps it); a
    symlink planted at the path is refused, never followed.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def append(self, run_id: str, turn: int) -> None:
        """Record that the model was asked for ``turn`` of ``run_id``."""
        line = json.dumps({"run_id": run_id, "turn": turn}) + "\n"
        append_line(self.path, line.encode())  # O_APPEND|O_NOFOLLOW, one write

    def turns(self, run_id: str | None = None) -> list[int]:
        """Every turn asked for, in order (of one run, or of all)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        # One decode for all lines: the crash sweep reads the log several times a scenario.
        entries = _ASKED_LINES.decode_lines(data)
        return [e.turn for e in entries if run_id is None or e.run_id == run_id]

    def paid_twice(self, run_id: str | None = None) -> int:
        """How many calls asked again for a turn already asked for."""
        turns = self.turns(run_id)
        return len(turns) - len(set(turns))


Fickle = Callable[[Reply, int], Reply]


def _new_call_ids(reply: Reply, attempt: int) -> Reply:
    """The default fickleness: the same calls under new call IDs."""
    calls = [replace(call, id=f"{call.id}-again{attempt}") for call in reply.calls]
    return replace(reply, calls=calls)


class ScriptedModel:
    """A model that answers turn n with the n-th reply of a list.

    Args:
        replies: the reply for each turn, in order.
        name: the model name recorded in the fingerprint.
        price: dollars per million tokens.
        log: a :class:`CallLog` (or its path) recording every call, across processes.
        fickle: when asked again for a turn it already answered (according to the
            log), answer differently: ``True`` gives the same calls new IDs; a
            function ``(reply, attempt) -> reply`` gives anything else.
    """

    def __init__(
        self,
        replies: Sequence[Reply],
        *,
        name: str = "scripted",
        price: Price | None = None,
        log: CallLog | str | os.PathLike[str] | None = None,
        fickle: bool | Fickle = False,
    ) -> None:
        self._replies = list(replies)
        self._name = name
        self._price = price or Price(input=3.0, output=15.0)
        self.log = log if isinstance(log, CallLog) or log is None else CallLog(log)
        self._fickle: Fickle | None = (
            _new_call_ids if fickle is True else (fickle if callable(fickle) else None)
        )
        self.calls: list[int] = []
        """Turns asked for by this process, in order."""

    @property
    def name(self) -> str:
        """The model name recorded in the fingerprint."""
        return self._name

    def dollars(self, usage: Usage) -> float:
        """What ``usage`` costs at this model's price."""
        return self._price.dollars(usage)

    def usage_bound(self, request: ModelRequest) -> Usage:
        """Exactly what the scripted reply for ``request.turn`` uses: the script knows."""
        if 1 <= request.turn <= len(self._replies):
            usage = self._replies[request.turn - 1].usage
            if isinstance(usage, Usage) and usage_problem(usage) is None:
                return usage
        # No such turn (reply() refuses it without a cost), or a scripted usage that
        # checked_reply will refuse with a clearer message than a bound could give.
        return Usage()

    async def reply(self, request: ModelRequest) -> Reply:
        """The scripted reply for ``request.turn``."""
        turn = request.turn
        if not 1 <= turn <= len(self._replies):
            raise ModelError(
                provider="scripted",
                reason=f"the script has {len(self._replies)} replies and turn {turn} was asked for",
                remedy="add replies to the script or lower max_turns",
            )
        earlier = self.log.turns(request.run_id).count(turn) if self.log else self.calls.count(turn)
        self.calls.append(turn)
        if self.log is not None:
            self.log.append(request.run_id, turn)
        reply = self._replies[turn - 1]
        if earlier and self._fickle is not None:
            reply = self._fickle(reply, earlier)
        return replace(reply, model=reply.model or self._name)
