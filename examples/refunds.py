"""A refund agent you can kill at any instant: run it again and it carries on."""

import asyncio
import json
from datetime import timedelta
from pathlib import Path

import durably
from durably import Agent, Call, Effect, FileStore, Limits, Reply, ToolContext, tool

HERE = Path("refund-demo")  # the runs, and the fake service's refunds


class Payments:
    """A fake payments service: it keeps refunds by idempotency key, as real ones do."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _refunds(self) -> dict[str, str]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    async def refund(self, order_id: str, cents: int, *, idempotency_key: str) -> str:
        """Refund ``cents`` on ``order_id`` once per key; a repeated key gets the first answer."""
        refunds = self._refunds()
        if idempotency_key not in refunds:  # a repeated key gets the first answer
            refunds[idempotency_key] = f"refund {len(refunds) + 1}: {cents} cents, {order_id}"
            temp = self.path.with_suffix(".tmp")  # a kill mid-write leaves the old file whole
            temp.write_text(json.dumps(refunds))
            temp.replace(self.path)
        return refunds[idempotency_key]

    async def search(self, *, idempotency_key: str) -> str | None:
        """The refund made with ``idempotency_key``, or None."""
        return self._refunds().get(idempotency_key)


payments = Payments(HERE / "payments.json")


async def find_refund(ctx: ToolContext, order_id: str, cents: int) -> durably.Lookup:
    """The refund already made with this call's key, if any (the ladder asks before a rerun)."""
    found = await payments.search(idempotency_key=ctx.idempotency_key)
    return durably.Found(found) if found else durably.NOT_FOUND


@tool(effect=Effect.KEYED, key_ttl=timedelta(hours=24), needs_approval=True, lookup=find_refund)
async def refund(ctx: ToolContext, order_id: str, cents: int) -> str:
    """Refund an order."""
    return await payments.refund(order_id, cents, idempotency_key=ctx.idempotency_key)


# A scripted stand-in; a real one: durably.models.anthropic.AnthropicModel("claude-haiku-4-5")
model = durably.ScriptedModel(
    [
        Reply(calls=[Call(id="c1", name="refund", arguments='{"order_id": "1042", "cents": 500}')]),
        Reply(text="Order 1042 is refunded."),
    ]
)


async def main() -> None:
    """Run the refund agent until it finishes, pauses or stops."""
    agent = Agent(
        model=model,
        tools=[refund],
        store=FileStore(HERE / "runs"),
        limits=Limits(max_turns=30, max_dollars=2.0),
        approver=durably.TerminalApprover(),
        system="You handle refunds.",
    )
    run_id = "refund-order-1042"  # chosen here, so a restarted process knows it
    try:
        outcome = await agent.run("refund order 1042", run_id=run_id)
    except durably.RunExists:  # started before, by a process that may have crashed
        outcome = await agent.resume(run_id)
    print(f"{outcome.run_id}: {outcome.status}: {outcome.answer}")


asyncio.run(main())
