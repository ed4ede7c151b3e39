"""OpenTelemetry spans (issue 38, item 5): a span per run, turn, model call and tool call with
the GenAI conventions' names, one trace per run across restarts, nothing when tracing is off.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from _helpers.patience import stretched
from _helpers.traced_child import RUN_ID, agent
from durably import (
    Agent,
    Call,
    Effect,
    FileStore,
    Reply,
    ScriptedModel,
    ToolContext,
    _tracing,
    tool,
)
from durably.state import ToolResult

HELPERS = Path(__file__).parent / "_helpers"
CHILD_TIMEOUT = stretched(120)


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """An in-memory exporter behind a tracer provider that durably sees during this test only.

    Not the global provider (set once per process, for good): every later test in the
    session would trace too.
    """
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    return exporter


def child(command: str, directory: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """Run ``traced_child.py`` in a new interpreter and wait for it."""
    return subprocess.run(
        [sys.executable, str(HELPERS / "traced_child.py"), command, str(directory), *extra],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        check=False,
    )


def by_name(spans: list[Any], prefix: str) -> list[Any]:
    """The spans whose name starts with ``prefix``."""
    return [s for s in spans if s["name"].startswith(prefix)]


def test_a_run_has_a_span_per_run_turn_model_call_and_tool_call(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    """One run in this process: invoke_agent over two turns, each with its chat span (model,
    tokens, dollars) and the tool's execute_tool span (name, call ID, effect, key, marker).
    """
    asyncio.run(agent(tmp_path).run("order a widget", run_id=RUN_ID))
    finished: tuple[ReadableSpan, ...] = spans.get_finished_spans()
    names = [s.name for s in finished]
    assert sorted(names) == sorted(
        [
            "chat scripted-1",
            "execute_tool order",
            "durably.turn 1",
            "chat scripted-1",
            "durably.turn 2",
            "invoke_agent durably",
        ]
    )
    assert {s.context.trace_id for s in finished if s.context} == {_tracing.trace_id_of(RUN_ID)}
    run = next(s for s in finished if s.name == "invoke_agent durably")
    turns = {
        (s.attributes or {})["durably.turn"]: s
        for s in finished
        if s.name.startswith("durably.turn")
    }
    chat = next(s for s in finished if s.name == "chat scripted-1")
    tool = next(s for s in finished if s.name == "execute_tool order")
    per_turn = (120 * 3.0 + 30 * 15.0) / 1e6  # the scripted model's price, per million tokens
    assert dict(run.attributes or {}) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "durably",
        "gen_ai.conversation.id": RUN_ID,
        "durably.run_id": RUN_ID,
        "durably.restart": 0,
        "durably.dollars": pytest.approx(2 * per_turn),
        "durably.outcome": "done",
        "gen_ai.usage.input_tokens": 240,
        "gen_ai.usage.output_tokens": 60,
    }
    assert chat.attributes is not None
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.attributes["gen_ai.request.model"] == "scripted-1"
    assert chat.attributes["gen_ai.usage.input_tokens"] == 120
    assert chat.attributes["gen_ai.usage.output_tokens"] == 30
    assert chat.attributes["durably.dollars"] == pytest.approx(per_turn)
    assert chat.parent is not None
    assert chat.parent.span_id in {t.context.span_id for t in turns.values() if t.context}
    assert tool.attributes is not None
    assert {k: tool.attributes[k] for k in tool.attributes if k != "durably.key"} == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "order",
        "gen_ai.tool.call.id": "c1",
        "gen_ai.tool.type": "function",
        "durably.effect": "idempotent",
        "durably.marker": "saved",
    }
    assert len(str(tool.attributes["durably.key"])) == 32
    assert tool.parent is not None
    assert turns[1].context is not None
    assert tool.parent.span_id == turns[1].context.span_id


def test_a_restart_continues_the_runs_trace(tmp_path: Path) -> None:
    """A run SIGKILLed after its tool returned, then resumed by another process: one trace ID
    over both processes' spans; the resume's run span counts restart 1 and the rerun tool span
    carries the ladder's step and verdict, with the marker kept from the first attempt.
    """
    crashed = child("run", tmp_path, "loop.tool_returned:order")
    assert crashed.returncode == -9, crashed.stderr
    resumed = child("resume", tmp_path)
    assert (resumed.returncode, resumed.stdout.strip()) == (0, "done"), resumed.stderr

    spans = [json.loads(line) for line in (tmp_path / "spans.jsonl").read_text().splitlines()]
    assert {s["trace_id"] for s in spans} == {f"{_tracing.trace_id_of(RUN_ID):032x}"}
    first, second = dict.fromkeys(s["pid"] for s in spans)  # two processes, in order
    before = [s for s in spans if s["pid"] == first]
    after = [s for s in spans if s["pid"] == second]
    # The killed process ended its model call and the tool's span before its SIGKILL.
    assert [s["name"] for s in before] == ["chat scripted-1", "execute_tool order"]
    (run,) = by_name(after, "invoke_agent")
    assert run["attributes"]["durably.restart"] == 1
    (rerun,) = by_name(after, "execute_tool order")
    assert rerun["attributes"]["durably.ladder.step"] == 1
    assert rerun["attributes"]["durably.ladder.verdict"] == "rerun"
    assert rerun["attributes"]["durably.marker"] == "kept"
    assert rerun["attributes"]["durably.key"] == before[1]["attributes"]["durably.key"]


def test_without_a_tracer_provider_durably_neither_imports_nor_traces(tmp_path: Path) -> None:
    """A run in a program that never imported OpenTelemetry leaves it unimported; one that
    imported the API but set no tracer provider gets the no-op hooks.
    """
    code = (
        "import asyncio, sys\n"
        "from durably import Agent, Reply, ScriptedModel, _tracing\n"
        "from durably import FileStore\n"
        f"store = FileStore({str(tmp_path / 'runs')!r})\n"
        "agent = Agent(model=ScriptedModel([Reply(text='hi')]), tools=[], store=store)\n"
        "assert asyncio.run(agent.run('say hi')).answer == 'hi'\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
        "import opentelemetry.trace\n"
        "print(_tracing.for_run('r', owner=agent, state=None) is _tracing.OFF)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=CHILD_TIMEOUT
    )
    assert (done.returncode, done.stdout.split("\n")[:2]) == (0, ["[]", "True"]), done.stderr


def test_a_pydantic_ai_run_is_traced_by_the_engine_it_runs_on(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    """The Pydantic AI front end gets the same spans with no code of its own: its model
    request is a chat span with the reply's tokens, its tool an execute_tool span.
    """
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.usage import RequestUsage

    from durably.pydantic_ai import Durable
    from pydantic_ai import Agent as PydanticAgent

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        usage = RequestUsage(input_tokens=50, output_tokens=5)
        if sum(isinstance(m, ModelResponse) for m in messages) == 0:
            call = ToolCallPart("look", {"order": "1042"}, tool_call_id="p1")
            return ModelResponse(parts=[call], usage=usage, model_name="fn")
        return ModelResponse(parts=[TextPart("found")], usage=usage, model_name="fn")

    durable = Durable(FileStore(tmp_path / "runs"))
    agent: PydanticAgent[None, str] = PydanticAgent(
        FunctionModel(reply, model_name="fn"), capabilities=[durable]
    )

    @agent.tool_plain(metadata={"effect": "read"})
    async def look(order: str) -> str:
        """Read an order."""
        return f"order {order}"

    result = asyncio.run(agent.run("look it up", run_id="pai-traced"))
    assert result.output == "found"
    finished = spans.get_finished_spans()
    ours = [
        s for s in finished if s.instrumentation_scope and s.instrumentation_scope.name == "durably"
    ]
    assert {s.context.trace_id for s in ours if s.context} == {_tracing.trace_id_of("pai-traced")}
    chats = [s for s in ours if s.name.startswith("chat ")]
    assert [(s.attributes or {}).get("gen_ai.usage.input_tokens") for s in chats] == [50, 50]
    (tool,) = [s for s in ours if s.name == "execute_tool look"]
    assert tool.attributes is not None
    assert (tool.attributes["gen_ai.tool.call.id"], tool.attributes["durably.marker"]) == (
        "p1",
        "none",
    )
    assert [s.name for s in ours if s.name.startswith("invoke_agent")] == ["invoke_agent durably"]


def test_a_tool_exception_reaches_the_run_as_it_was_when_traced(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    """A tool's exception whose str() raises is saved as it is untraced (tracing never
    replaces it), and its span ends with an error status naming the exception's type.
    """

    class Unshowable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    @tool(effect=Effect.READ)
    async def odd(ctx: ToolContext) -> str:
        """Fail oddly."""
        raise Unshowable

    model = ScriptedModel([Reply(calls=[Call(id="c1", name="odd")]), Reply(text="ok")])
    agent = Agent(model=model, tools=[odd], store=FileStore(tmp_path / "runs"))
    outcome = asyncio.run(agent.run("try", run_id="odd-run"))
    (result,) = [m for m in outcome.state.messages if isinstance(m, ToolResult)]
    assert result.content == "Unshowable: <the message could not be shown: RuntimeError>"
    (span,) = [s for s in spans.get_finished_spans() if s.name == "execute_tool odd"]
    assert (span.status.status_code.name, span.status.description) == ("ERROR", "Unshowable")


def test_an_openai_agents_run_is_traced_by_the_engine_it_runs_on(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    """The OpenAI Agents front end gets the same spans with no code of its own: a chat span
    per model request with its tokens, an execute_tool span for its function tool.
    """
    from agents import Agent as SdkAgent
    from agents import ModelResponse, function_tool, set_tracing_disabled
    from agents import Usage as SdkUsage
    from agents.models.interface import Model
    from agents.testing import assistant_message, function_call

    from durably.openai_agents import DurableRunner

    class Scripted(Model):
        async def get_response(
            self, system_instructions: Any, input: Any, *a: Any, **k: Any
        ) -> Any:
            answered = not isinstance(input, str) and any(
                (i.get("type") if isinstance(i, dict) else getattr(i, "type", None))
                == "function_call_output"
                for i in input
            )
            output = (
                [assistant_message("found")]
                if answered
                else [function_call("look", {"order": "1042"}, call_id="o1")]
            )
            usage = SdkUsage(requests=1, input_tokens=70, output_tokens=7, total_tokens=77)
            return ModelResponse(output=output, usage=usage, response_id=None)

        def stream_response(self, *a: Any, **k: Any) -> Any:
            raise NotImplementedError

    @function_tool
    async def look(order: str) -> str:
        """Read an order."""
        return f"order {order}"

    set_tracing_disabled(True)  # the SDK's own tracing would export to OpenAI
    agent = SdkAgent(name="desk", instructions="Look it up.", model=Scripted(), tools=[look])
    runner = DurableRunner(FileStore(tmp_path / "runs"), effects={"look": Effect.READ})
    result = asyncio.run(runner.run(agent, "look it up", run_id="oai-traced"))
    assert result.final_output == "found"
    ours = [
        s
        for s in spans.get_finished_spans()
        if s.instrumentation_scope and s.instrumentation_scope.name == "durably"
    ]
    assert {s.context.trace_id for s in ours if s.context} == {_tracing.trace_id_of("oai-traced")}
    chats = [s for s in ours if s.name.startswith("chat ")]
    assert [(s.attributes or {}).get("gen_ai.usage.input_tokens") for s in chats] == [70, 70]
    (tool_span,) = [s for s in ours if s.name == "execute_tool look"]
    assert (tool_span.attributes or {}).get("gen_ai.tool.call.id") == "o1"
    assert [s.name for s in ours if s.name.startswith("invoke_agent")] == ["invoke_agent durably"]


def test_a_span_open_when_the_run_starts_is_linked_not_made_the_parent(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    """A run started inside the caller's span (an HTTP request's) keeps its own trace, and
    its invoke_agent span links to the caller's span.
    """
    caller = trace.get_tracer_provider().get_tracer("app")
    with caller.start_as_current_span("POST /refunds") as request:
        asyncio.run(agent(tmp_path).run("order a widget", run_id=RUN_ID))
    finished = spans.get_finished_spans()
    (run,) = [s for s in finished if s.name == "invoke_agent durably"]
    assert run.context is not None
    assert run.context.trace_id == _tracing.trace_id_of(RUN_ID)
    assert [link.context for link in run.links] == [request.get_span_context()]
