"""Checkpoint cost per turn of one OpenAI Agents SDK agent: DurableRunner vs DBOSRunner vs bare.

The agent runs on a scripted SDK ``Model`` (no network): ``--turns`` turns, each a
reply calling one tool with about 1 KB of arguments and a tool result of about 1 KB,
then its answer. The contenders run the same agent side by side in one process, one
turn at a time in rotating order (``_turns``: a gate per contender, one open at a
time). A turn is timed from its gate opening (the model's reply handed back) to the
next model request reaching the gate: the reply's checkpoint, the tool call and its
checkpoints, and the next request's. Its bytes are what the process passed to
``write()`` over the same span. The added latency and bytes of a contender are its
medians minus the bare agent's, measured in the same run.

- bare: ``Runner.run(agent, task)``, nothing saved.
- durably: ``DurableRunner(JournalStore(dir))`` (fsync on), the tool declared ``keyed``.
- durably FileStore: ``DurableRunner(FileStore(dir))`` (fsync on): the whole state per save.
- DBOS: ``DBOSRunner.run`` (``dbos-openai-agents``) inside a ``@DBOS.workflow`` with
  DBOS's SQLite system database, the tool a ``@DBOS.step`` as its README says (DBOS
  records each model reply and each tool result as a step).

The comparison runs ``--repeat`` times (3 by default) on fresh files; the verdict is
on the median of each ratio over the runs. Targets (issue 36): durably's added
latency per turn at most 0.5x DBOS's, its bytes per turn at most 0.2x.

Run: ``.venv/bin/python benchmarks/openai_agents_turns.py [--repeat 3] [--turns 40] [--dir DIR]``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import _turns
from _turns import PAYLOAD
from agents import Agent, ModelResponse, Runner, Usage, function_tool, set_tracing_disabled
from agents.models.interface import Model
from agents.testing import assistant_message, function_call
from dbos import DBOS, SetWorkflowID
from dbos_openai_agents import DBOSRunner  # type: ignore[import-untyped]

import durably
from durably.openai_agents import DurableRunner
from durably.stores import Store

"""durably / DBOS ratios of the added cost per turn the issue asks for (at most)."""

CONTENDERS = ("bare", "durably", "durably FileStore", "DBOS")
TASK = "record the texts"


class GateModel(Model):
    """The scripted model: a tool call per turn, then the answer; each request waits at the gate."""

    def __init__(self, gate: _turns.Gate) -> None:
        self.gate = gate

    async def get_response(self, system_instructions: Any, input: Any, *a: Any, **k: Any) -> Any:
        """The reply to the request's turn, once the driver lets this contender on."""
        items = [] if isinstance(input, str) else input
        turn = 1 + sum(_kind(i) == "function_call_output" for i in items)
        await self.gate.wait()
        usage = Usage(requests=1, input_tokens=100, output_tokens=20, total_tokens=120)
        if turn > self.gate.turns:
            return ModelResponse(output=[assistant_message("done")], usage=usage, response_id=None)
        output = [
            assistant_message("Recording."),
            function_call("record", {"text": PAYLOAD}, call_id=f"call-{turn}"),
        ]
        return ModelResponse(output=output, usage=usage, response_id=None)

    def stream_response(self, *a: Any, **k: Any) -> AsyncIterator[Any]:
        """Not used: every contender runs ``Runner.run``."""
        raise NotImplementedError("the scripted model does not stream")


def _kind(item: Any) -> Any:
    return item.get("type") if isinstance(item, dict) else getattr(item, "type", None)


def _as_is(function: Any) -> Any:
    return function


def agent_for(name: str, gate: _turns.Gate, base: Path) -> Callable[[], Awaitable[object]]:
    """The coroutine function that runs the contender's agent once."""
    # A step name per repeat: DBOS registers each function once.
    step: Callable[[Any], Any] = (
        DBOS.step(name=f"record-{base.parent.name}") if name == "DBOS" else _as_is
    )

    @function_tool
    @step
    async def record(text: str) -> str:
        """Record a text (about 1 KB back)."""
        return PAYLOAD

    agent = Agent(name="recorder", instructions="Record.", model=GateModel(gate), tools=[record])
    run_id = "bench-" + name.replace(" ", "-")
    if name == "bare":
        return lambda: Runner.run(agent, TASK, max_turns=gate.turns + 1)
    if name == "DBOS":
        DBOS_AGENTS[base.parent.name] = agent, gate.turns + 1

        async def in_workflow() -> object:
            with SetWorkflowID(f"bench-{base.parent.name}"):
                return await dbos_run(base.parent.name)

        return in_workflow
    store: Store = (
        durably.JournalStore(base / "journal")
        if name == "durably"
        else durably.FileStore(base / "files")
    )
    runner = DurableRunner(
        store,
        effects={"record": durably.Effect.KEYED},
        key_ttls={"record": timedelta(days=1)},
    )
    return lambda: runner.run(agent, TASK, run_id=run_id, max_turns=gate.turns + 1)


DBOS_AGENTS: dict[str, tuple[Agent[Any], int]] = {}
"""The DBOS contender's agent and its turn limit in each repeat, by the repeat's directory name."""


@DBOS.workflow()
async def dbos_run(repeat: str) -> str:
    """The DBOS contender's agent run, as its integration asks: inside a workflow."""
    agent, max_turns = DBOS_AGENTS[repeat]
    return str((await DBOSRunner.run(agent, TASK, max_turns=max_turns)).final_output)


async def run_once(turns: int, base: Path) -> _turns.Summary:
    """Every contender's run, one turn at a time in rotating order, and its medians."""
    gates = {name: _turns.Gate(name, turns) for name in CONTENDERS}
    runners = {
        name: agent_for(name, gates[name], base / name.replace(" ", "-")) for name in CONTENDERS
    }
    await _turns.interleave(gates, runners, turns)
    return _turns.summary(gates)


def main() -> None:
    """Run the comparison ``--repeat`` times and print each contender's medians and the verdict."""
    set_tracing_disabled(True)  # no network: nothing to export traces to
    _turns.main(
        description=__doc__.splitlines()[0],
        agent="OpenAI Agents SDK agent",
        prefix="durably-bench-oai-",
        packages=("openai-agents", "dbos-openai-agents", "dbos", "durably"),
        run_once=run_once,
    )


if __name__ == "__main__":
    main()
