"""durably for LangGraph: ``DurablySaver`` (checkpoints) and ``DurableTools`` (tool calls).

``DurablySaver`` is a checkpointer on durably's journal files; ``DurableTools``
makes each tool call exactly once, on durably's engine.

Install with ``pip install 'durably[langgraph]'`` and pass it where a LangGraph
checkpointer goes::

    from durably.langgraph import DurablySaver

    with DurablySaver("state/threads") as saver:
        graph = builder.compile(checkpointer=saver)
        graph.invoke(inputs, {"configurable": {"thread_id": "t1"}}, durability="sync")

and make each tool call exactly once (``tools = DurableTools(JournalStore("state/tools"))``,
then ``ToolNode(tools_list, wrap_tool_call=tools.wrap_tool_call,
awrap_tool_call=tools.awrap_tool_call)`` or ``create_agent(...,
middleware=[tools.middleware()])``).

What it guarantees and what it does not is in ``docs/langgraph.md``.
"""

try:
    import langgraph.checkpoint.base  # noqa: F401 - only to say what is missing
except ImportError as exc:  # pragma: no cover - the dev extra installs LangGraph
    raise ImportError(
        "durably.langgraph needs LangGraph; install it with: pip install 'durably[langgraph]'"
    ) from exc

from ._postgres import PostgresThreadSaver as PostgresThreadSaver
from ._saver import PRUNE_STRATEGIES as PRUNE_STRATEGIES
from ._saver import DurablySaver as DurablySaver
from ._saver import StaleThread as StaleThread
from ._saver import ThreadValueRefused as ThreadValueRefused
from ._thread import ThreadLocked as ThreadLocked
from ._tools import DurableTools as DurableTools
from ._tools import tool_context as tool_context

__all__ = [
    "PRUNE_STRATEGIES",
    "DurableTools",
    "DurablySaver",
    "PostgresThreadSaver",
    "StaleThread",
    "ThreadLocked",
    "ThreadValueRefused",
    "tool_context",
]
