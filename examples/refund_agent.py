"""A refund agent whose approvals wait for a person: the operators' example (docs/operators.md).

``payments`` is a stand-in for a payment provider: a JSON-lines ledger that
deduplicates by idempotency key (as Stripe does). The model is scripted, so the
example needs no API key. Every refund needs a person's approval, asked *later*:
the run pauses, a person answers with ``durably answer`` or ``durably console``,
and ``durably resume`` carries the run on::

    python examples/refund_agent.py              # starts a run; it pauses for approval
    durably pending runs/
    durably answer RUN CALL yes runs/
    durably resume RUN runs/ --agent refund_agent:agent   # with examples/ importable

``REFUND_LEDGER`` and ``REFUND_STORE`` move the ledger and the store.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import durably
from durably import Agent, Call, Effect, FileStore, Limits, Reply, ScriptedModel, ToolContext, tool
from durably.decisions import AskLater
from durably.stores import Store


class Payments:
    """A payment provider's refunds, deduplicated by idempotency key."""

    def __init__(self, ledger: Path) -> None:
        self.ledger = ledger

    def _entries(self) -> list[dict[str, object]]:
        if not self.ledger.exists():
            return []
        return [json.loads(line) for line in self.ledger.read_text().splitlines() if line]

    async def search(self, *, idempotency_key: str) -> str | None:
        """The refund made with this key, if any."""
        for entry in self._entries():
            if entry["key"] == idempotency_key:
                return str(entry["id"])
        return None

    async def refund(self, order_id: str, cents: int, *, idempotency_key: str) -> str:
        """Refund once per key; a repeat returns the first refund."""
        found = await self.search(idempotency_key=idempotency_key)
        if found is not None:
            return found
        refund_id = f"re_{len(self._entries()) + 1}"
        with self.ledger.open("a") as out:
            entry = {"id": refund_id, "key": idempotency_key, "order": order_id, "cents": cents}
            out.write(json.dumps(entry) + "\n")
        return refund_id


payments = Payments(Path(os.environ.get("REFUND_LEDGER", "refunds.jsonl")))


async def find_refund(ctx: ToolContext, order_id: str, cents: int) -> durably.Lookup:
    """The refund already made with this call's key, if any (the ladder asks before a rerun)."""
    found = await payments.search(idempotency_key=ctx.idempotency_key)
    return durably.Found(found) if found else durably.NOT_FOUND


@tool(effect=Effect.KEYED, key_ttl=timedelta(hours=24), needs_approval=True, lookup=find_refund)
async def refund(ctx: ToolContext, order_id: str, cents: int) -> str:
    """Refund an order."""
    return await payments.refund(order_id, cents, idempotency_key=ctx.idempotency_key)


def agent(store: Store | None = None) -> Agent:
    """The refund agent, on the store the service uses (``durably resume --agent``).

    Args:
        store: another store. A Postgres worker drives the agent on the run it
            claimed, so the default store is never opened there.
    """
    model = ScriptedModel(
        [
            Reply(
                text="Order 1042 was charged twice; refunding the duplicate.",
                calls=[
                    Call(
                        id="call-refund-1042",
                        name="refund",
                        arguments='{"order_id": "1042", "cents": 2500}',
                    )
                ],
            ),
            Reply(text="Refunded 25.00 on order 1042."),
        ]
    )
    return Agent(
        model=model,
        tools=[refund],
        store=store or FileStore(os.environ.get("REFUND_STORE", "runs/")),
        limits=Limits(max_turns=30, max_dollars=2.0),
        approver=AskLater(),
        system="You handle refunds.",
    )


if __name__ == "__main__":
    outcome = agent().run_sync("refund order 1042", name="refund")
    print(outcome.run_id, outcome.status)
