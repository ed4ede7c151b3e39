"""The sweep's front-desk agent, durable under ``dbos-openai-agents`` or under durably.

Run as a process: ``python _oai_peer.py SYSTEM ROOT PHASE [KILL_AT]``. SYSTEM is
``dbos`` (``DBOSRunner`` inside a ``@DBOS.workflow``, every tool a ``@DBOS.step``,
as its README says), ``dbos-plain`` (the same, the tools left plain) or
``durably`` (``DurableRunner``). ROOT is the world's directory, PHASE ``run``
(start the run) or ``resume`` (carry it on the way the system says to: DBOS
relaunched so it recovers the pending workflow of the same ID, durably
``DurableRunner.resume``). With KILL_AT naming a kind of effect (``refunds``,
``emails``, ``notes``), the first process to perform one SIGKILLs itself right after
the service acted, before the tool returns: the moment neither system has recorded
the tool's result.

The agent is ``_oai_world``'s: a read, a refund, an e-mail, a note and a handoff to
the closer, on the scripted SDK ``Model``, here asked for the e-mail and the note in
two replies (so each kill has one meaning under both systems). The service takes
no idempotency key: durably's refund is a ``write`` with a lookup by its key, the
e-mail a ``write`` with a lookup, the note a ``write`` with none (a person, who
checks the service, answers), as the sweep's "keys ignored" world declares them.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))  # tests/, for _helpers
sys.path.insert(0, str(Path(__file__).parent))

from _oai_world import OpenAIAgentsJob, ScriptedModel, agents, build
from agents import set_tracing_disabled

import durably
from _helpers.peer import run_dbos_workflow
from _helpers.refund_world import ANSWER, Service
from durably.sweep import RUN_ID, Config, SweepApprover, World

KILL_POINTS = ("refunds", "emails", "notes")
CONFIG = Config(name="keys ignored", honour_keys=False)


def _service(root: Path, kill_at: str | None) -> Service:
    return Service(root / "service", honour_keys=False, kill_after=kill_at)


def _log(root: Path) -> durably.CallLog:
    return durably.CallLog(root / "model.jsonl")


def counts(root: Path) -> dict[str, int]:
    """Effects by kind, model asks, replies paid more than once, and questions to a person."""
    service = _service(root, None)
    turns = _log(root).turns(RUN_ID)
    questions = root / "questions.jsonl"
    found = {kind: len(service.lines(kind)) for kind in KILL_POINTS}
    found["asks"] = len(turns)
    found["paid twice"] = len(turns) - len(set(turns))
    found["questions"] = len(questions.read_text().splitlines()) if questions.exists() else 0
    return found


async def _durably(root: Path, phase: str, kill_at: str | None) -> str:
    world = World(root=root, config=CONFIG)
    approver = SweepApprover(OpenAIAgentsJob(), world)
    service = _service(root, kill_at)
    service.prepare()
    store = world.store()
    try:
        desk, runner = build(
            store, service, _log(root), approver=approver, config=CONFIG, sequential=True
        )
        if phase == "run":
            result = await runner.run(desk, OpenAIAgentsJob().task(), run_id=RUN_ID)
        else:
            result = await runner.resume(desk, RUN_ID)
    finally:
        await store.close()
    return str(result.final_output)


async def _dbos(root: Path, phase: str, kill_at: str | None, *, steps: bool) -> str:
    from dbos import DBOS
    from dbos_openai_agents import DBOSRunner  # type: ignore[import-untyped]

    set_tracing_disabled(True)
    service = _service(root, kill_at)
    service.prepare()
    model = ScriptedModel(_log(root), sequential=True)
    # DBOS hands a tool no idempotency key; this service takes none anyway.
    desk = agents(service, model, key=str, step=DBOS.step() if steps else None)

    @DBOS.workflow()
    async def refund_workflow(task: str) -> str:
        return str((await DBOSRunner.run(desk, task)).final_output)

    return await run_dbos_workflow(root, phase, RUN_ID, OpenAIAgentsJob().task(), refund_workflow)


def main(argv: list[str]) -> None:
    """``SYSTEM ROOT PHASE [KILL_AT]``: print the run's answer as JSON."""
    system, root, phase = argv[0], Path(argv[1]), argv[2]
    kill_at = argv[3] if len(argv) > 3 else None
    root.mkdir(parents=True, exist_ok=True)
    if system == "durably":
        answer = asyncio.run(_durably(root, phase, kill_at))
    else:
        answer = asyncio.run(_dbos(root, phase, kill_at, steps=system == "dbos"))
    print(json.dumps({"answer": answer}))


if __name__ == "__main__":
    main(sys.argv[1:])

__all__ = ["ANSWER", "KILL_POINTS", "counts"]
