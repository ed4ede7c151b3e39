"""A Pydantic AI refund agent made durable by one capability: kill it, run it again.

Runs on Pydantic AI's FunctionModel (no network). Run it twice: the second run
answers from the saved run, asking the model nothing and refunding nothing.
"""

import asyncio
import json
from pathlib import Path

from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import durably
from durably.pydantic_ai import Durable, tool_context
from pydantic_ai import Agent

HERE = Path("pydantic-ai-demo")  # the runs, and the fake service's refunds
REFUNDS = HERE / "refunds.json"


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The scripted model: refund order 1042, then say so."""
    if not any(isinstance(m, ModelResponse) for m in messages):
        call = ToolCallPart("refund", {"order_id": "1042", "cents": 500}, tool_call_id="c1")
        return ModelResponse(parts=[TextPart("Refunding order 1042."), call])
    return ModelResponse(parts=[TextPart("Refunded 500 cents on order 1042.")])


def refund_once(key: str, order_id: str, cents: int) -> str:
    """The fake payments service: one refund per idempotency key, the first answer kept."""
    refunds = json.loads(REFUNDS.read_text()) if REFUNDS.exists() else {}
    refunds.setdefault(key, f"refund of {cents} cents on {order_id}")
    REFUNDS.write_text(json.dumps(refunds))
    return str(refunds[key])


def refunds_made() -> int:
    """How many refunds the service holds."""
    return len(json.loads(REFUNDS.read_text()))


async def main() -> None:
    """Start the run, or carry it on from its last save."""
    async with durably.FileStore(HERE / "runs") as store:
        durable = Durable(store)
        agent = Agent(FunctionModel(model), capabilities=[durable])

        @agent.tool_plain(metadata={"effect": "keyed"})
        async def refund(order_id: str, cents: int) -> str:
            """Refund an order (the service deduplicates on the idempotency key)."""
            key = tool_context().idempotency_key  # sent in the service's channel
            return refund_once(key, order_id, cents)

        if "refund-1042" in await store.list_runs():
            result = await durable.resume(agent, "refund-1042")
        else:
            result = await agent.run("refund order 1042", run_id="refund-1042")
        print(f"{result.output} ({refunds_made()} refund in the service)")


if __name__ == "__main__":
    HERE.mkdir(exist_ok=True)
    asyncio.run(main())
