"""Child processes for the cancel and prune tests: an owner running an agent, a holder, a pruner.

Usage: ``python housekeeping_child.py <command> <store kind> <state-dir> <run-id> [label]``,
the store kind ``file`` (``FileStore``) or ``journal`` (``JournalStore``). The commands:

- ``run``: run :func:`stepper` as ``run-id``. Each call of its tool ``step`` is written
  to ``<state-dir>/../world.txt`` (its call ID and key, a line each); at call ``c2`` it prints
  ``in-tool c2`` and waits until ``<state-dir>/../go`` exists. It prints the outcome
  as JSON (status, turns, stop reason).
- ``hold``: open the run, print ``ready``, and keep it open until stdin closes.
- ``prune``: prune every finished run (``older_than`` 0, ``now`` a day ahead) under a
  CrashPlan that SIGKILLs this process at crash point ``label`` (``label@N``: its
  Nth time; none when empty: strace kills it instead); print the report as JSON if
  it is never reached.
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import timedelta
from pathlib import Path

# Run as a script: import the shared helpers as the tests do (and as mypy names them).
sys.path[:0] = [str(Path(__file__).parent.parent)]

from durably import (  # noqa: E402
    Agent,
    Effect,
    FileStore,
    JournalStore,
    Reply,
    ScriptedModel,
    ToolContext,
    tool,
)
from durably.faults import CrashPlan, installed  # noqa: E402
from durably.models import Call  # noqa: E402
from durably.state import utcnow  # noqa: E402

STEPS = 5
"""Turns of :func:`stepper`, one ``step`` call each, before its answer."""


def make_store(kind: str, directory: str | Path) -> FileStore:
    """The store of kind ``file`` or ``journal`` over ``directory``."""
    return JournalStore(directory) if kind == "journal" else FileStore(directory)


def stepper(store: FileStore, world: Path, *, wait_at: str | None = "c2") -> Agent:
    """An agent that calls ``step`` once a turn for :data:`STEPS` turns, then answers.

    ``step`` is a keyed write (an attempt marker before each call) that appends its
    call ID and key to ``world``; at call ``wait_at`` it says so and waits for a line on stdin.
    """

    @tool(effect=Effect.KEYED, key_ttl=timedelta(hours=23))
    async def step(ctx: ToolContext, n: int) -> str:
        """Take step ``n`` (appended to the world file)."""
        with world.open("a") as out:
            out.write(f"{ctx.call_id} {ctx.idempotency_key}\n")  # the key goes to the service
        if ctx.call_id == wait_at:
            print(f"in-tool {ctx.call_id}", flush=True)
            # The test writes a line once `durably cancel` has answered.
            await asyncio.to_thread(sys.stdin.readline)
        return f"step {n} taken"

    replies = [
        Reply(calls=[Call(id=f"c{n}", name="step", arguments=json.dumps({"n": n}))])
        for n in range(1, STEPS + 1)
    ]
    model = ScriptedModel([*replies, Reply(text="all steps taken")])
    return Agent(model=model, tools=[step], store=store)


def main(command: str, kind: str, directory: str, run_id: str, label: str = "") -> None:
    store = make_store(kind, directory)
    if command == "run":
        world = Path(directory).parent / "world.txt"
        outcome = stepper(store, world).run_sync("take the steps", run_id=run_id)
        print(
            json.dumps(
                {"status": outcome.status, "turns": outcome.turns, "stop": outcome.stop_reason}
            ),
            flush=True,
        )
    elif command == "hold":
        store.open_sync(run_id)
        print("ready", flush=True)
        sys.stdin.read()
    elif command == "prune":
        name, _, occurrence = label.partition("@")
        plan = CrashPlan(label=name or None, occurrence=int(occurrence or 1))
        with installed(plan):
            report = store.prune_sync(timedelta(0), utcnow() + timedelta(days=1))
        print(json.dumps({"pruned": report.pruned, "owned": report.owned, "reached": plan.reached}))
    else:
        sys.exit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
