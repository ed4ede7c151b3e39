"""The seam between the loop and a model: the request, the reply, and the check of a reply.

:class:`Model` answers a :class:`ModelRequest` with a :class:`Reply`;
:func:`checked_reply` refuses a reply durably cannot store. ``durably.models``
re-exports every name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from .._values import describe, text_problem
from ..errors import ModelError
from ..state import Message, Usage

__all__ = [
    "Call",
    "Delta",
    "Model",
    "ModelRequest",
    "Price",
    "Reply",
    "ToolSpec",
    "UsageBound",
    "checked_reply",
    "usage_problem",
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
