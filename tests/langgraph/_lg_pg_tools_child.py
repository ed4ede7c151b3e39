"""A ToolNode graph with a keyed charging tool: PostgresThreadSaver, DurableTools(PostgresStore).

``python _lg_pg_tools_child.py DSN CHARGES LABEL``: runs (or resumes: claim, once the
killed owner's 1 s lease ran out, then ``invoke(None)``) thread ``t`` to its end. The
``charge`` tool appends its cents and idempotency key to CHARGES, as a payment service
records a request; with a LABEL other than ``-``, the process SIGKILLs itself at that crash point (a
:class:`durably.faults.CrashPlan`). Prints one JSON line: the last message.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from durably import faults
from durably.langgraph import DurableTools, PostgresThreadSaver, ThreadLocked, tool_context
from durably.postgres import PostgresStore

_, DSN, CHARGES, LABEL = sys.argv
THREAD: Any = {"configurable": {"thread_id": "t"}}


@tool
def charge(cents: int) -> str:
    """Charge the card."""
    with open(CHARGES, "a") as log:
        log.write(f"{cents} {tool_context().idempotency_key}\n")
    return f"charged {cents}"


charge.metadata = {"effect": "keyed", "key_ttl": 3600}


def agent(state: MessagesState) -> dict[str, list[Any]]:
    if any(isinstance(m, ToolMessage) for m in state["messages"]):
        return {"messages": [AIMessage(content="all done", id="reply-2")]}
    call = {"name": "charge", "args": {"cents": 500}, "id": "call-0"}
    return {"messages": [AIMessage(content="", id="reply-1", tool_calls=[call])]}


def main() -> dict[str, Any]:
    # A killed owner's leases run out soon; LG_LEASE gives a test a longer one.
    lease = timedelta(seconds=float(os.environ.get("LG_LEASE", "1")))
    tools = DurableTools(PostgresStore(DSN, lease=lease))
    with PostgresThreadSaver(DSN, lease=lease) as saver:
        builder = StateGraph(MessagesState)
        builder.add_node("agent", agent)
        node = ToolNode(
            [charge], wrap_tool_call=tools.wrap_tool_call, awrap_tool_call=tools.awrap_tool_call
        )
        builder.add_node("tools", node)
        builder.add_edge(START, "agent")
        builder.add_conditional_edges("agent", tools_condition)
        builder.add_edge("tools", "agent")
        graph = builder.compile(checkpointer=saver)
        deadline = time.monotonic() + 300  # generous: the lease is 1 s
        while True:
            try:
                saver.claim("t")
                break
            except ThreadLocked:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        inputs: Any = None
        if graph.get_state(THREAD).created_at is None:
            inputs = {"messages": [HumanMessage("charge me", id="q")]}
        plan = faults.CrashPlan(label=LABEL) if LABEL != "-" else faults.CrashPlan()
        with faults.installed(plan):
            out = graph.invoke(inputs, THREAD, durability="sync")
        return {"last": out["messages"][-1].content}


if __name__ == "__main__":
    print(json.dumps(main()), flush=True)
