"""The LangGraph agent the saver's tests run: a tool-calling loop on a scripted chat model.

The model is langchain-core's ``FakeMessagesListChatModel``, told to answer by
the conversation (the Nth reply is the one after N-1 earlier replies) rather
than by a counter in the process, so a restarted process gets the same reply
for the same turn, as a real model asked the same question would be expected to.
Every reply but the last calls the ``lookup`` tool, whose result is about
``RESULT_BYTES`` of seeded random letters (text that does not compress better than
prose would): the ``messages`` channel grows by two messages per round.
"""

from __future__ import annotations

import os
import random
import string
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatResult
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

RESULT_BYTES = 1000


class ScriptedChatModel(FakeMessagesListChatModel):
    """Answers with ``responses[k]``, where ``k`` is the number of replies already in the input."""

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.i = sum(isinstance(m, AIMessage) for m in messages)
        return super()._generate(messages, stop, run_manager, **kwargs)


@tool
def lookup(n: int) -> str:
    """Look up record ``n``."""
    effects = os.environ.get("LG_EFFECTS")
    if effects:  # the crash tests count how often a tool really ran
        with open(effects, "a") as log:
            log.write(f"{n}\n")
    words = random.Random(n).choices(string.ascii_lowercase, k=RESULT_BYTES)
    return f"record {n}: " + "".join(words)


def script(rounds: int) -> list[BaseMessage]:
    """``rounds`` replies calling ``lookup``, then a final answer."""
    replies: list[BaseMessage] = [
        AIMessage(
            content=f"looking up record {n}",
            id=f"reply-{n}",
            tool_calls=[{"name": "lookup", "args": {"n": n}, "id": f"call-{n}"}],
        )
        for n in range(rounds)
    ]
    replies.append(AIMessage(content=f"done after {rounds} lookups", id=f"reply-{rounds}"))
    return replies


def build(checkpointer: Any, *, rounds: int) -> Any:
    """The compiled agent graph: agent -> tools -> agent ... -> END (2 supersteps a round)."""
    model = ScriptedChatModel(responses=script(rounds))

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([lookup]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)


def question() -> dict[str, list[BaseMessage]]:
    """The run's input."""
    return {"messages": [HumanMessage(content="look everything up", id="question")]}


def summary(messages: list[BaseMessage]) -> list[tuple[Any, ...]]:
    """What a conversation says, without the random IDs LangGraph gives tool messages."""
    out: list[tuple[Any, ...]] = []
    for m in messages:
        calls = tuple((c["name"], repr(c["args"]), c["id"]) for c in getattr(m, "tool_calls", []))
        out.append((m.type, m.content, calls, getattr(m, "tool_call_id", None)))
    return out
