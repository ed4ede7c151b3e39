"""A child process that runs m1 against a fake provider and is SIGKILLed at a crash point.

Usage: ``python _models_child.py PROVIDER BASE_URL WORLD STORE RUN_ID LABEL OCCURRENCE``.
The world must exist; the run is started under ``RUN_ID`` with a
:class:`~durably.faults.CrashPlan` that kills this process at the
``OCCURRENCE``-th crash point labelled ``LABEL``. The label ``mid-stream``
instead kills it (SIGKILL) from the observer, at the first piece of a call's
arguments streamed in turn ``OCCURRENCE``: while the reply is still arriving.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from _models_fakes import provider_model

from durably import FileStore, PolicyApprover
from durably.faults import CrashPlan, installed
from durably.loop import Event
from durably.triage.agent import build_agent
from durably.triage.world import World, load_task


def main(  # noqa: PLR0917 - a child's argv, positional by nature
    provider: str, base_url: str, world_root: str, store_dir: str, run_id: str, label: str, nth: str
) -> None:
    world = World.open(world_root)
    model = provider_model(provider, base_url, log=world.model_log)

    def observe(event: Event) -> None:
        if event.kind == "arguments-delta" and event.data["turn"] == int(nth):
            os.kill(os.getpid(), signal.SIGKILL)

    agent = build_agent(
        world=world,
        store=FileStore(store_dir),
        approver=PolicyApprover(),
        model=model,
        observer=observe if label == "mid-stream" else None,
    )
    plan = CrashPlan(label=None if label == "mid-stream" else label, occurrence=int(nth))
    with installed(plan):
        asyncio.run(agent.run(load_task(world.task).description, run_id=run_id))
    sys.exit(f"crash point {label} #{nth} was never reached")


if __name__ == "__main__":
    main(*sys.argv[1:])
