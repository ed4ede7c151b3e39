"""durably's conversation in each provider's format: summary first, roles, IDs, arguments."""

from __future__ import annotations

from durably import ModelRequest
from durably.models import ToolSpec
from durably.models import anthropic as claude
from durably.models import openai as gpt
from durably.models._provider import SUMMARY_INTRO
from durably.state import AssistantMessage, ToolCall, ToolResult, UserMessage

SPEC = ToolSpec(
    name="show_report",
    description="Show one crash report.",
    schema={"type": "object", "properties": {"report_id": {"type": "string"}}},
)

SUMMARY = "user: triage m1\nassistant: listed 6 reports"

REQUEST = ModelRequest(
    run_id="r",
    turn=3,
    system="Be careful.",
    summary=SUMMARY,
    messages=(
        UserMessage(text="Go on with the reports."),
        AssistantMessage(
            text="Reading two.",
            calls=(
                ToolCall(id="c1", name="show_report", arguments='{"report_id": "CR-1", "z": "é"}'),
                ToolCall(id="c2", name="show_report", arguments='{"report_id": '),
            ),
            turn=2,
        ),
        ToolResult(call_id="c1", name="show_report", content="CR-1: KeyError"),
        ToolResult(call_id="c2", name="show_report", content="not JSON", is_error=True),
        UserMessage(text="(note from the harness)"),
    ),
    tools=(SPEC,),
)


def test_anthropic_turns_alternate_with_the_summary_first() -> None:
    """The summary opens the first user turn; same-role blocks merge; results answer by ID."""
    turns = claude.to_messages(REQUEST)

    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    summary, task = turns[0]["content"]
    assert summary["text"] == SUMMARY_INTRO + SUMMARY
    assert task["text"] == "Go on with the reports."
    text, first, second = turns[1]["content"]
    assert text == {"type": "text", "text": "Reading two."}
    assert first == {
        "type": "tool_use",
        "id": "c1",
        "name": "show_report",
        "input": {"report_id": "CR-1", "z": "é"},
    }
    assert second["input"] == {}  # arguments that are not JSON were answered with an error
    assert turns[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "c1", "content": "CR-1: KeyError"},
        {"type": "tool_result", "tool_use_id": "c2", "content": "not JSON", "is_error": True},
        {"type": "text", "text": "(note from the harness)"},
    ]
    assert claude.to_tools([SPEC]) == [
        {"name": "show_report", "description": SPEC.description, "input_schema": SPEC.schema}
    ]


def test_openai_messages_keep_arguments_verbatim_and_flag_errors_in_text() -> None:
    """System, summary, then the conversation; arguments go back byte for byte."""
    messages = gpt.to_messages(REQUEST)

    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "user",
        "assistant",
        "tool",
        "tool",
        "user",
    ]
    assert messages[0]["content"] == "Be careful."
    assert messages[1]["content"] == SUMMARY_INTRO + SUMMARY
    calls = messages[3]["tool_calls"]
    assert [c["id"] for c in calls] == ["c1", "c2"]
    assert calls[0]["function"]["arguments"] == '{"report_id": "CR-1", "z": "é"}'
    assert calls[1]["function"]["arguments"] == '{"report_id": '
    assert messages[4] == {"role": "tool", "tool_call_id": "c1", "content": "CR-1: KeyError"}
    assert messages[5] == {"role": "tool", "tool_call_id": "c2", "content": "Error: not JSON"}
    assert gpt.to_tools([SPEC])[0]["function"]["parameters"] == SPEC.schema


def test_without_a_summary_the_task_comes_first() -> None:
    """No summary, no extra message: the task is the first user message."""
    request = ModelRequest(
        run_id="r", turn=1, system="", messages=(UserMessage(text="task"),), tools=()
    )
    assert claude.to_messages(request) == [
        {"role": "user", "content": [{"type": "text", "text": "task"}]}
    ]
    assert gpt.to_messages(request) == [{"role": "user", "content": "task"}]
