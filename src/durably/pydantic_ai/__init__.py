"""durably for Pydantic AI: ``Durable``, a capability that makes an agent's runs durable.

Install with ``pip install 'durably[pydantic-ai]'`` and add it to the agent::

    from durably.pydantic_ai import Durable

    agent = Agent(model, capabilities=[Durable(store, default_effect=Effect.WRITE)])
    result = await agent.run(task, run_id="refunds-1")

A killed process carries the run on with ``await durable.resume(agent, "refunds-1")``;
a Postgres worker runs it once registered as ``worker_agent(agent)``.
What it guarantees and what it does not is in ``docs/pydantic-ai.md``.
"""

try:
    import pydantic_ai.capabilities  # noqa: F401 - only to say what is missing
except ImportError as exc:  # pragma: no cover - the dev extra installs Pydantic AI
    raise ImportError(
        "durably.pydantic_ai needs Pydantic AI; install it with: pip install 'durably[pydantic-ai]'"
    ) from exc

from ._durable import Durable as Durable
from ._durable import RunPaused as RunPaused
from ._durable import WorkerAgent as WorkerAgent
from ._durable import key_in_meta as key_in_meta
from ._durable import tool_context as tool_context
from ._durable import worker_agent as worker_agent

__all__ = ["Durable", "RunPaused", "WorkerAgent", "key_in_meta", "tool_context", "worker_agent"]
