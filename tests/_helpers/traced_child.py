"""A child process running a traced agent, for the tracing tests; some die by SIGKILL.

Usage: ``python traced_child.py <run|resume> <directory> [crash-label]``.

The agent (a scripted model: turn 1 calls ``order``, turn 2 answers) keeps its runs
in ``<directory>/runs``; ``order`` appends a line to ``<directory>/orders``. The
OpenTelemetry SDK is set up with the in-memory exporter, each finished span also
appended as one JSON line to ``<directory>/spans.jsonl`` at once (with this
process's ID), so the spans a process ended before its SIGKILL are kept.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from durably import Agent, Call, Effect, FileStore, Reply, ScriptedModel, ToolContext, Usage, tool
from durably.faults import CrashPlan, installed

RUN_ID = "traced-run"


class KeptSpans(InMemorySpanExporter):
    """The SDK's in-memory exporter, also appending each span to a file as it ends."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Keep ``spans`` in memory and on disk."""
        for span in spans:
            context = span.context
            parent = span.parent
            line = {
                "name": span.name,
                "pid": os.getpid(),
                "trace_id": f"{context.trace_id:032x}" if context else None,
                "span_id": f"{context.span_id:016x}" if context else None,
                "parent_id": f"{parent.span_id:016x}" if parent else None,
                "attributes": dict(span.attributes or {}),
                "status": span.status.status_code.name,
            }
            with self.path.open("a") as out:
                out.write(json.dumps(line) + "\n")
        return super().export(spans)


def agent(directory: Path) -> Agent:
    """The traced agent; every process builds the same one."""

    @tool(effect=Effect.IDEMPOTENT)
    async def order(ctx: ToolContext, item: str) -> str:
        """Place an order."""
        with (directory / "orders").open("a") as out:
            out.write(item + "\n")
        return f"ordered {item}"

    usage = Usage(input_tokens=120, output_tokens=30)
    model = ScriptedModel(
        [
            Reply(calls=[Call(id="c1", name="order", arguments='{"item": "widget"}')], usage=usage),
            Reply(text="ordered", usage=usage),
        ],
        name="scripted-1",
    )
    return Agent(model=model, tools=[order], store=FileStore(directory / "runs"))


def main(command: str, directory: str, label: str = "") -> None:
    root = Path(directory)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(KeptSpans(root / "spans.jsonl")))
    trace.set_tracer_provider(provider)
    runner = agent(root)
    if command == "run":
        with installed(CrashPlan(label=label)):
            asyncio.run(runner.run("order a widget", run_id=RUN_ID))
        sys.exit(f"crash point {label} was never reached")
    outcome = asyncio.run(runner.resume(RUN_ID))
    provider.shutdown()
    print(outcome.status)


if __name__ == "__main__":
    main(*sys.argv[1:])
