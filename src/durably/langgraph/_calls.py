"""A LangGraph tool call as durably's engine sees it, and its result as LangGraph's message.

:class:`~durably.langgraph._tools.DurableTools` turns each call it serves into a
:class:`Served` (its run, its call ID, the reply it came in) and turns what the
engine settles back into the ``ToolMessage`` LangGraph expects; a person's resume
value becomes a durably answer (:func:`decision_of`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage

from ..approval import Done, No, Rerun, Yes
from ..engine import RunSession
from ..state import ApprovalKind, ToolCall, Usage
from ..tools import Tool

__all__ = [
    "Served",
    "ToolErrorMessage",
    "call_id",
    "decision_of",
    "message_of",
    "messages_of",
    "question_for",
    "replayed",
    "reply_of",
    "text_of",
    "usage_of",
]


@dataclass(frozen=True, kw_only=True)
class Served:
    """One tool call as the engine sees it: its run, its call, the reply it belongs to."""

    run_id: str
    call: ToolCall
    tool: Tool | None
    """None: the tool is not registered, and LangGraph answers the call itself."""
    reply: tuple[ToolCall, ...]
    """Every call of the model message this call came in (saved together as one reply)."""
    turn: int
    usage: Usage
    tool_call_id: str
    arguments: dict[str, Any]


class ToolErrorMessage(Exception):
    """A tool's error message (``status="error"``), saved as an error result with its text."""


def call_id(anchor: str, tool_call_id: str | None) -> str:
    """The durably call ID of a tool call: its model message (or task) and its own ID."""
    return f"{anchor}.{tool_call_id}"


def messages_of(state: Any) -> list[Any]:
    """The messages of a graph's state (a dict, an object with ``messages``, or a list)."""
    messages = state.get("messages") if isinstance(state, Mapping) else None
    if messages is None:
        messages = getattr(state, "messages", None)
    if messages is None and isinstance(state, list):
        messages = state
    return list(messages or ())


def usage_of(message: AIMessage | None) -> Usage:
    """The tokens a model message says it cost (for people: LangGraph pays the model)."""
    metadata = getattr(message, "usage_metadata", None) or {}
    return Usage(
        input_tokens=int(metadata.get("input_tokens", 0) or 0),
        output_tokens=int(metadata.get("output_tokens", 0) or 0),
    )


def reply_of(state: Any, tool_call_id: str) -> tuple[AIMessage | None, int]:
    """The newest model message holding ``tool_call_id`` in the state, and its turn (1-based)."""
    replies = [m for m in messages_of(state) if isinstance(m, AIMessage)]
    for turn in range(len(replies), 0, -1):
        message = replies[turn - 1]
        if any(c.get("id") == tool_call_id for c in message.tool_calls):
            return message, turn
    return None, 0


def text_of(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content)


def message_of(result: Any, served: Served) -> ToolMessage:
    if isinstance(result, ToolMessage):
        return result
    raise TypeError(
        f"tool {served.call.name!r} returned {type(result).__name__}; durably.langgraph saves "
        "a tool's ToolMessage (its text), and a Command that updates the graph is not covered"
    )


def replayed(content: str, is_error: bool, served: Served) -> ToolMessage:
    """A saved result as the message LangGraph would have had from the tool."""
    return ToolMessage(
        content=content,
        name=served.call.name,
        tool_call_id=served.tool_call_id,
        status="error" if is_error else "success",
    )


def question_for(session: RunSession, served: Served) -> dict[str, Any]:
    """What ``interrupt()`` shows the graph's caller: the saved question and how to answer it."""
    asked = session.state.pending.get(served.call.id)
    kind = "resolve" if asked is not None and asked.kind is ApprovalKind.RESOLVE else "approve"
    answers = "'yes' or {'no': reason}" if kind == "approve" else "'rerun' or {'done': result}"
    return {
        "durably": kind,
        "run_id": served.run_id,
        "call_id": served.call.id,
        "tool": served.call.name,
        "arguments": served.call.arguments,
        "why": asked.why if asked is not None else None,
        "answer": f"Command(resume={answers}), or durably answer {served.run_id} "
        f"{served.call.id} ... and invoke(None)",
    }


def decision_of(value: object, served: Served) -> Yes | No | Rerun | Done:
    """A resume value as a person's answer: Yes/No/Rerun/Done, or their plain forms."""
    if isinstance(value, Yes | No | Rerun | Done):
        return value
    if value in ("yes", "rerun"):
        return Yes() if value == "yes" else Rerun()
    if value == "no":
        return No()
    if isinstance(value, Mapping) and len(value) == 1:
        ((kind, text),) = value.items()
        if kind == "done" and isinstance(text, str):
            return Done(text)
        if kind == "no" and isinstance(text, str):
            return No(text)
    raise ValueError(
        f"call {served.call.id!r} of tool {served.call.name!r}: resume with 'yes', 'no', "
        f"{{'no': reason}}, 'rerun' or {{'done': result}} (or durably.Yes/No/Rerun/Done), "
        f"not {value!r}; nothing was saved"
    )
