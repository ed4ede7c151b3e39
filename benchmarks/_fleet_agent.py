"""The agent ``benchmarks/fleet.py`` runs, for ``durably worker --import _fleet_agent``.

A scripted model that takes ``$FLEET_MODEL_SECONDS`` to answer each turn (a real
model's latency, scaled down), calling a keyed tool ``$FLEET_TURNS - 1`` times, then
answering. The tool takes ``$FLEET_TOOL_SECONDS`` and returns ``$FLEET_TOOL_BYTES``
of incompressible text (hex of a hash chain), so each turn adds a few KB to the
state. Every name in ``$FLEET_AGENTS`` (comma-separated) is registered with the
same agent: the benchmark gives each configuration a name of its own, so a
configuration's workers claim only its runs.

When ``$FLEET_CLAIMS`` names a file, each run's first model call appends
``run_id wall-clock-time`` to it: the moment a worker began the run, read back by
the benchmark for submit-to-claim and claim-to-done.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time

import durably
import durably.postgres
from durably import Agent, Call, Effect, Reply, ScriptedModel, ToolContext, Usage
from durably.models import ModelRequest

TURNS = int(os.environ.get("FLEET_TURNS", "6"))
MODEL_SECONDS = float(os.environ.get("FLEET_MODEL_SECONDS", "0.2"))
TOOL_SECONDS = float(os.environ.get("FLEET_TOOL_SECONDS", "0.05"))
TOOL_BYTES = int(os.environ.get("FLEET_TOOL_BYTES", "3000"))
CLAIMS = os.environ.get("FLEET_CLAIMS")


class SlowScriptedModel(ScriptedModel):
    """A scripted model that takes a while to answer, as a real one does."""

    async def reply(self, request: ModelRequest) -> Reply:
        if request.turn == 1 and CLAIMS:
            with open(CLAIMS, "a") as out:  # noqa: ASYNC230 -- one short line a run
                out.write(f"{request.run_id} {time.time():.6f}\n")
        await asyncio.sleep(MODEL_SECONDS)
        return await super().reply(request)


def script() -> list[Reply]:
    """``TURNS - 1`` calls of the keyed tool, then the answer."""
    usage = Usage(input_tokens=1500, output_tokens=80)
    replies = [
        Reply(calls=[Call(f"f{n}", "fetch", f'{{"page": {n}}}')], usage=usage)
        for n in range(1, TURNS)
    ]
    return [*replies, Reply(text="report written", usage=usage)]


@durably.tool(effect=Effect.KEYED, key_ttl=durably.NEVER_EXPIRES)
async def fetch(ctx: ToolContext, page: int) -> str:
    """Fetch a page of the report (keyed: the service deduplicates by idempotency key)."""
    await asyncio.sleep(TOOL_SECONDS)
    seed = hashlib.sha256(f"{ctx.run_id}/{ctx.idempotency_key}/{page}".encode()).digest()
    text = ""
    while len(text) < TOOL_BYTES:
        seed = hashlib.sha256(seed).digest()
        text += seed.hex()
    return text[:TOOL_BYTES]


def make_agent(run_id: str) -> Agent:
    """The benchmark's agent (no store: the worker drives it on the claimed run)."""
    return Agent(
        model=SlowScriptedModel(script()),
        tools=[fetch],
        system="You write the report.",
    )


for _name in filter(None, os.environ.get("FLEET_AGENTS", "fleet").split(",")):
    durably.postgres.register(_name, make_agent, task="write the report")
