"""A process that resumes a LangGraph thread whose next step charges a card.

``python _lg_claim_child.py DIR THREAD MODE CHARGES GATE`` where MODE is ``setup``
(run the agent up to its tools step and stop: the charge is next), ``recipe``
(docs/langgraph.md's resume recipe: claim, then read and invoke) or ``unclaimed``
(the same without the claim). DIR is a directory (``DurablySaver``) or, starting with
``pg:``, a DSN (``PostgresThreadSaver``; ``$LG_LEASE`` seconds of lease). The ``charge``
tool appends a line to CHARGES, then, if GATE is not ``-``, waits for that file to
exist: the test holds a process in the middle of its charge. Prints one JSON line: what happened.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from durably.errors import LeaseLost
from durably.langgraph import DurablySaver, PostgresThreadSaver, StaleThread, ThreadLocked

_, DIRECTORY, THREAD, MODE, CHARGES, GATE = sys.argv


@tool
def charge(cents: int) -> str:
    """Charge the customer's card."""
    with open(CHARGES, "a") as log:
        log.write(f"{cents}\n")
    if GATE != "-":
        deadline = time.monotonic() + 300  # generous: the test opens it within seconds
        while not Path(GATE).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    return f"charged {cents}"


def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
    if any(m.type == "tool" for m in state["messages"]):
        return {"messages": [AIMessage(content="charged", id="reply-1")]}
    call = {"name": "charge", "args": {"cents": 500}, "id": "call-0"}
    return {"messages": [AIMessage(content="charging", id="reply-0", tool_calls=[call])]}


def open_saver() -> DurablySaver | PostgresThreadSaver:
    """The saver DIR names."""
    if DIRECTORY.startswith("pg:"):
        lease = timedelta(seconds=float(os.environ.get("LG_LEASE", "15")))
        return PostgresThreadSaver(DIRECTORY[3:], lease=lease)
    return DurablySaver(DIRECTORY)


def build(saver: DurablySaver | PostgresThreadSaver, **compile_options: Any) -> Any:
    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([charge]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver, **compile_options)


def main() -> dict[str, Any]:
    config: Any = {"configurable": {"thread_id": THREAD}}
    inputs = {"messages": [HumanMessage(content="charge me", id="question")]}
    with open_saver() as saver:
        if MODE == "setup":
            build(saver, interrupt_before=["tools"]).invoke(inputs, config, durability="sync")
            return {"how": "set up"}
        try:
            if MODE == "recipe":
                saver.claim(THREAD)  # ThreadLocked here, before anything is read or run
            graph = build(saver)
            if graph.get_state(config).created_at is None:
                graph.invoke(inputs, config, durability="sync")
            else:
                graph.invoke(None, config, durability="sync")
        except (ThreadLocked, StaleThread, LeaseLost) as exc:
            return {"error": type(exc).__name__, "message": str(exc)}
        return {"how": "ran"}


if __name__ == "__main__":
    print(json.dumps(main()), flush=True)
