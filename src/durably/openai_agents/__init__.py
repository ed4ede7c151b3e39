"""durably for the OpenAI Agents SDK: ``DurableRunner``, a runner whose runs are durable.

Install with ``pip install 'durably[openai-agents]'`` and run the agent through it::

    from durably.openai_agents import DurableRunner

    runner = DurableRunner(store, effects={"refund": Effect.KEYED}, default_effect=Effect.WRITE)
    result = await runner.run(agent, task, run_id="refunds-1")

A killed process carries the run on with ``await runner.resume(agent, "refunds-1")``;
a Postgres worker runs it once registered as ``worker_agent(agent, DurableRunner(None, ...))``.
What it guarantees and what it does not is in ``docs/openai-agents.md``.
"""

try:
    import agents.models.interface  # noqa: F401 - only to say what is missing
except ImportError as exc:  # pragma: no cover - the dev extra installs the SDK
    raise ImportError(
        "durably.openai_agents needs the OpenAI Agents SDK; install it with: "
        "pip install 'durably[openai-agents]'"
    ) from exc

from ._model import ReplayDiverged as ReplayDiverged
from ._runner import DurableRunner as DurableRunner
from ._runner import RunPaused as RunPaused
from ._runner import tool_context as tool_context
from ._worker import WorkerAgent as WorkerAgent
from ._worker import worker_agent as worker_agent

__all__ = [
    "DurableRunner",
    "ReplayDiverged",
    "RunPaused",
    "WorkerAgent",
    "tool_context",
    "worker_agent",
]
