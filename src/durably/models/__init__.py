"""Models: the seam between the loop and whatever writes the replies.

A :class:`Model` takes a :class:`ModelRequest` (system prompt, the conversation,
the tool schemas, the turn number) and returns a :class:`Reply`: text, tool
calls with the model's call IDs and raw argument strings, and usage. A model
call has no side effect, so adapters may retry transient failures inside it.

:class:`ScriptedModel` answers from a list given in code, by turn, so a resumed
run in a new process continues the script. It can log every call it answers to
a file, which is how tests count replies paid twice across processes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .._sysio import append_line
from ..errors import ModelError
from ..state import Message, Usage

__all__ = [
    "Call",
    "CallLog",
    "Model",
    "ModelRequest",
    "Price",
    "Reply",
    "ScriptedModel",
    "ToolSpec",
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
        if not self.path.exists():
            return []
        entries = [json.loads(line) for line in self.path.read_text().splitlines() if line]
        return [e["turn"] for e in entries if run_id is None or e["run_id"] == run_id]

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
