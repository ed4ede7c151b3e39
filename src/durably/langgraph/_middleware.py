"""``DurableToolsMiddleware``: :class:`~durably.langgraph.DurableTools` for ``create_agent``.

LangChain's agents run every tool call through their middleware's
``wrap_tool_call``/``awrap_tool_call``; this one hands each to ``DurableTools``.
Imported only when asked for (``DurableTools.middleware()``): a ``ToolNode`` graph
needs no LangChain agents package.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from langchain.agents.middleware import AgentMiddleware

__all__ = ["DurableToolsMiddleware"]


class _Tools(Protocol):
    """What the middleware hands its calls to: ``DurableTools`` (which imports this module)."""

    def wrap_tool_call(self, request: Any, execute: Callable[[Any], Any]) -> Any: ...
    async def awrap_tool_call(
        self, request: Any, execute: Callable[[Any], Awaitable[Any]]
    ) -> Any: ...
    def finish(self, state: Any, runtime: Any) -> None: ...
    async def afinish(self, state: Any, runtime: Any) -> None: ...


class DurableToolsMiddleware(AgentMiddleware[Any, Any, Any]):
    """Every tool call of a ``create_agent`` agent, made exactly once through ``DurableTools``."""

    def __init__(self, tools: _Tools) -> None:
        super().__init__()
        self.durable = tools

    def after_agent(self, state: Any, runtime: Any) -> None:
        """Save the agent's answer as its thread's last reply (``DurableTools.finish``)."""
        self.durable.finish(state, runtime)

    async def aafter_agent(self, state: Any, runtime: Any) -> None:
        """The async form of :meth:`after_agent`."""
        await self.durable.afinish(state, runtime)

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Settle the call through durably's engine (see :meth:`DurableTools.wrap_tool_call`)."""
        return self.durable.wrap_tool_call(request, handler)

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        """The async form of :meth:`wrap_tool_call`."""
        return await self.durable.awrap_tool_call(request, handler)
