"""Checkpoint cost per turn of one Pydantic AI agent: Durable vs DBOSDurability vs the bare agent.

The agent runs on ``FunctionModel`` (no network): ``--turns`` turns, each a reply
calling one tool with about 1 KB of arguments and a tool result of about 1 KB, then
its answer. The contenders run the same agent side by side in one process, one turn
at a time in rotating order: the model function of each waits at a gate, and the
driver opens one gate at a time, so no contender's work overlaps another's.

A turn is timed from its gate opening (the model's reply handed back) to the next
model request reaching the gate: the reply's checkpoint, the tool call and its
checkpoints, and the next request's. Its bytes are what the process passed to
``write()`` over the same span (``wchar`` in ``/proc/self/io``; DBOS writes from
its own threads too, so the whole process is counted). The added latency of a
contender is its median turn minus the bare agent's median turn, measured in the
same run; its added bytes are its median bytes per turn minus the bare agent's.

- bare: ``Agent(model)``, nothing saved.
- durably: ``Durable(JournalStore(dir))`` (fsync on), the tool declared ``keyed``.
- durably FileStore: ``Durable(FileStore(dir))`` (fsync on): the whole state per save.
- DBOS: ``DBOSDurability()`` with DBOS's SQLite system database, the run inside a
  ``@DBOS.workflow`` (DBOS records each model reply as a step; the tool runs in the
  workflow's code).

The comparison runs ``--repeat`` times (3 by default) on fresh files; the verdict
is on the median of each ratio over the runs. Targets (issue 34): durably's added
latency per turn at most 0.5x DBOS's, its bytes per turn at most 0.2x.

Run: ``.venv/bin/python benchmarks/pydantic_ai_turns.py [--repeat 3] [--turns 40] [--dir DIR]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import _turns
from _turns import PAYLOAD
from dbos import DBOS, SetWorkflowID
from pydantic_ai.durable_exec.dbos import DBOSDurability
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import durably
from durably.pydantic_ai import Durable
from pydantic_ai import Agent

"""durably / DBOS ratios of the added cost per turn the issue asks for (at most)."""

CONTENDERS = ("bare", "durably", "durably FileStore", "DBOS")


class Gate(_turns.Gate):
    """A contender's gate, with the Pydantic AI model that waits at it."""

    def model(self) -> FunctionModel:
        """The scripted model: a keyed tool call per turn, then the answer."""

        async def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            turn = sum(isinstance(m, ModelResponse) for m in messages) + 1
            await self.wait()
            if turn > self.turns:
                return ModelResponse(parts=[TextPart("done")], model_name="scripted")
            call = ToolCallPart("record", {"text": PAYLOAD}, tool_call_id=f"call-{turn}")
            return ModelResponse(parts=[TextPart("Recording."), call], model_name="scripted")

        return FunctionModel(reply, model_name="scripted")


def agent_for(name: str, gate: Gate, base: Path) -> tuple[Agent[None, str], Any]:
    """The contender's agent and the coroutine function that runs it once."""
    capabilities: list[Any] = []
    if name == "durably":
        capabilities = [Durable(durably.JournalStore(base / "journal"))]
    elif name == "durably FileStore":
        capabilities = [Durable(durably.FileStore(base / "files"))]
    elif name == "DBOS":
        capabilities = [DBOSDurability()]
    # A name per repeat: DBOS registers its steps under the agent's name, once each.
    agent: Agent[None, str] = Agent(
        gate.model(), name=f"bench_{base.parent.name}", capabilities=capabilities
    )

    @agent.tool_plain(metadata={"effect": "keyed", "key_ttl": 86400.0})
    async def record(text: str) -> str:
        """Record a text (about 1 KB back)."""
        return PAYLOAD

    run_id = "bench-" + name.replace(" ", "-")

    async def run() -> str:
        return str((await agent.run("record the texts", run_id=run_id)).output)

    if name == "DBOS":
        DBOS_RUNS[base.parent.name] = run

        async def in_workflow() -> str:
            with SetWorkflowID(f"bench-{base.parent.name}"):
                return await dbos_run(base.parent.name)

        return agent, in_workflow
    return agent, run


DBOS_RUNS: dict[str, Any] = {}
"""The DBOS contender's run of each repeat, by the repeat's directory name."""


@DBOS.workflow()
async def dbos_run(repeat: str) -> str:
    """The DBOS contender's agent run, as its integration asks: inside a workflow."""
    return str(await DBOS_RUNS[repeat]())


async def run_once(turns: int, base: Path) -> _turns.Summary:
    """Every contender's run, one turn at a time in rotating order, and its medians."""
    gates = {name: Gate(name, turns) for name in CONTENDERS}
    runners = {
        name: agent_for(name, gates[name], base / name.replace(" ", "-"))[1] for name in CONTENDERS
    }
    await _turns.interleave(gates, runners, turns)
    return _turns.summary(gates)


def main() -> None:
    """Run the comparison ``--repeat`` times and print each contender's medians and the verdict."""
    _turns.main(
        description=__doc__.splitlines()[0],
        agent="Pydantic AI agent",
        prefix="durably-bench-pai-",
        packages=("pydantic-ai-slim", "dbos", "durably"),
        run_once=run_once,
    )


if __name__ == "__main__":
    main()
