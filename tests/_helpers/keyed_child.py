"""A child process for the KeyNotSent and ladder-log tests: a refund agent (approved by
policy) whose keyed tool may ignore its key. It configures no logging, as a user's script.

Usage: ``python keyed_child.py <command> <dir> <tool> [strict]``:

- ``command``: ``run`` (SIGKILLed just after the refund call returned, before its
  result is saved) or ``resume`` (prints the outcome's status);
- ``dir``: holds the run store (``runs/``) and the payment service (``service/``),
  which deduplicates on every key it is sent;
- ``tool``: ``ignores`` (sends no key: the mistake) or ``sends`` (sends ``ctx.idempotency_key``);
- ``strict``: run under ``durably.testing.strict()``.
"""

from __future__ import annotations

import asyncio
import sys
import warnings
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path

import durably
from durably import Call, Effect, Reply, ToolContext
from durably.faults import CrashPlan, installed
from durably.testing import FakeService, strict

RUN_ID = "refund-run"


def agent(root: Path, tool: str) -> durably.Agent:
    """A refund agent against the payment service in ``root``."""
    service = FakeService(root / "service")

    @durably.tool(effect=Effect.KEYED, key_ttl=timedelta(hours=23), needs_approval=True)
    async def refund(ctx: ToolContext, order_id: str) -> str:
        """Refund an order."""
        key = ctx.idempotency_key if tool == "sends" else None
        return service.perform(f"refund {order_id}", key=key)

    model = durably.ScriptedModel(
        [
            Reply(calls=[Call("c1", "refund", '{"order_id": "1042"}')]),
            Reply(text="Order 1042 is refunded."),
        ]
    )
    return durably.Agent(
        model=model,
        tools=[refund],
        store=durably.FileStore(root / "runs"),
        approver=durably.PolicyApprover(),
    )


def main(command: str, directory: str, tool: str, mode: str = "") -> None:
    # Python's default: each warning shown once, as a user who configured nothing sees it.
    warnings.simplefilter("default")
    root = Path(directory)
    with strict() if mode == "strict" else nullcontext():
        if command == "run":
            with installed(CrashPlan(label="loop.tool_returned:refund")):
                asyncio.run(agent(root, tool).run("refund order 1042", run_id=RUN_ID))
            sys.exit("the crash point was never reached")
        outcome = asyncio.run(agent(root, tool).resume(RUN_ID))
        print(outcome.status)


if __name__ == "__main__":
    main(*sys.argv[1:])
