"""One Pydantic AI agent, durable under DBOS (``DBOSDurability``) or durably (``Durable``).

Run as a process: ``python _pai_peer.py SYSTEM ROOT PHASE [KILL_AT]``. SYSTEM is
``dbos`` or ``durably``, ROOT the world's directory, PHASE ``run`` (start the run)
or ``resume`` (carry it on the way the system says to: DBOS relaunched so it
recovers the pending workflow of the same ID, durably ``Durable.resume``). With
KILL_AT naming a tool, the first process to run that tool SIGKILLs itself right
after the service acted, before the tool returns: the moment neither system has
recorded the tool's result.

The agent runs on ``FunctionModel`` (no network): a refund, then an e-mail, then
its answer. The service counts its effects in JSON-lines files and takes no
idempotency key, so a repeated call is a repeated effect. durably's tools are
``write`` with a lookup that checks the service, as docs/pydantic-ai.md says to
declare such a tool; DBOS's are plain tools, as its integration takes them.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent.parent))  # tests/, for _helpers

from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import durably
from _helpers.peer import kill_once, run_dbos_workflow
from durably import ToolContext
from pydantic_ai import Agent

RUN_ID = "refund-1042"
TASK = "refund order 1042 and tell the customer"
ANSWER = "Refunded 1042; customer told."
KILL_POINTS = ("refund", "send_email")


_FILES = {"refund": "refunds", "send_email": "emails"}


def _lines(root: Path, name: str) -> list[dict[str, Any]]:
    path = root / f"{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def effects(root: Path) -> dict[str, int]:
    """How many times the service refunded and e-mailed."""
    return {tool: len(_lines(root, name)) for tool, name in _FILES.items()}


def _record(root: Path, name: str, record: dict[str, Any], kill_at: str | None) -> None:
    with (root / f"{name}.jsonl").open("a") as out:
        out.write(json.dumps(record) + "\n")
    if kill_at is not None and name == _FILES[kill_at]:
        kill_once(root)


def _model(root: Path) -> FunctionModel:
    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages) + 1
        with (root / "model.jsonl").open("a") as out:
            out.write(json.dumps(turn) + "\n")
        if turn == 1:
            parts: list[Any] = [ToolCallPart("refund", {"order": "1042"}, tool_call_id="c1")]
        elif turn == 2:
            parts = [ToolCallPart("send_email", {"to": "a@b.c"}, tool_call_id="c2")]
        else:
            parts = [TextPart(ANSWER)]
        return ModelResponse(parts=parts, model_name="scripted")

    return FunctionModel(reply, model_name="scripted")


def _add_tools(agent: Agent[None, str], root: Path, kill_at: str | None, meta: Any) -> None:
    @agent.tool_plain(metadata=meta)
    async def refund(order: str) -> str:
        """Refund an order."""
        _record(root, "refunds", {"order": order}, kill_at)
        return f"refunded {order}"

    @agent.tool_plain(metadata=meta)
    async def send_email(to: str) -> str:
        """E-mail the customer."""
        _record(root, "emails", {"to": to}, kill_at)
        return f"sent to {to}"


async def _durably(root: Path, phase: str, kill_at: str | None) -> str:
    from durably.pydantic_ai import Durable

    async def find_refund(ctx: ToolContext, order: str) -> durably.Lookup:
        done = {"order": order} in _lines(root, "refunds")
        return durably.Found(f"refunded {order}") if done else durably.NOT_FOUND

    async def find_email(ctx: ToolContext, to: str) -> durably.Lookup:
        done = {"to": to} in _lines(root, "emails")
        return durably.Found(f"sent to {to}") if done else durably.NOT_FOUND

    durable = Durable(
        durably.FileStore(root / "state"),
        lookups={"refund": find_refund, "send_email": find_email},
    )
    agent: Agent[None, str] = Agent(_model(root), capabilities=[durable])
    _add_tools(agent, root, kill_at, {"effect": "write"})
    if phase == "run":
        result = await agent.run(TASK, run_id=RUN_ID)
    else:
        result = await durable.resume(agent, RUN_ID)
    return str(result.output)


async def _dbos(root: Path, phase: str, kill_at: str | None) -> str:
    from dbos import DBOS
    from pydantic_ai.durable_exec.dbos import DBOSDurability

    agent: Agent[None, str] = Agent(_model(root), name="refunds", capabilities=[DBOSDurability()])
    _add_tools(agent, root, kill_at, None)

    @DBOS.workflow()
    async def refund_workflow(task: str) -> str:
        return (await agent.run(task)).output

    return await run_dbos_workflow(root, phase, RUN_ID, TASK, refund_workflow)


def main(argv: list[str]) -> None:
    """``SYSTEM ROOT PHASE [KILL_AT]``: print the run's answer as JSON."""
    system, root, phase = argv[0], Path(argv[1]), argv[2]
    kill_at = argv[3] if len(argv) > 3 else None
    root.mkdir(parents=True, exist_ok=True)
    run = {"dbos": _dbos, "durably": _durably}[system]
    print(json.dumps({"answer": asyncio.run(run(root, phase, kill_at))}))


if __name__ == "__main__":
    main(sys.argv[1:])
