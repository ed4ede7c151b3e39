"""durably's conversation in each provider's format: summary first, roles, IDs, arguments."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from durably import ModelRequest
from durably.loop import ContextPolicy
from durably.models import ToolSpec
from durably.models import anthropic as claude
from durably.models import openai as gpt
from durably.models._provider import SUMMARY_INTRO
from durably.state import (
    AssistantMessage,
    RunState,
    ToolCall,
    ToolResult,
    UserMessage,
    utcnow,
)

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


def marked(blocks: list[dict[str, Any]]) -> list[int]:
    """Indexes of the blocks that carry a cache breakpoint."""
    return [i for i, block in enumerate(blocks) if "cache_control" in block]


def test_anthropic_breakpoints_mark_the_fixed_part_and_both_ends_of_the_last_turn() -> None:
    """Three breakpoints: after the system prompt, where the last request ended, and at the end."""
    calls = tuple(ToolCall(id=f"c{i}", name="show_report", arguments="{}") for i in range(12))
    results = tuple(ToolResult(call_id=c.id, name=c.name, content="ok") for c in calls)
    request = replace(
        REQUEST,
        summary=None,
        messages=(
            UserMessage(text="Triage."),
            AssistantMessage(text="All twelve.", calls=calls, turn=1),
            *results,
        ),
    )
    turns = claude.to_messages(request)
    tools = claude.to_tools(request.tools)
    system = [{"type": "text", "text": request.system}]
    claude.cache_breakpoints(tools, system, turns)
    assert (marked(tools), marked(system)) == ([], [0])
    # 25 blocks after the previous request's end: more than the API's look-back of 20.
    assert [marked(t["content"]) for t in turns] == [[0], [], [11]]

    again = claude.to_messages(request)
    assert [{k: v for k, v in b.items() if k != "cache_control"} for b in turns[-1]["content"]] == (
        again[-1]["content"]
    )


def test_the_context_policy_changes_the_prefix_only_when_it_folds() -> None:
    """Between two folds every request starts with the previous request, so it can hit the cache."""
    policy = ContextPolicy(max_messages=10, keep=4)
    state = RunState(
        run_id="r", task="t", created_at=utcnow(), messages=[UserMessage(text="Triage.")]
    )
    previous: list[dict[str, Any]] = []
    folds = 0
    for turn in range(1, 31):
        call = ToolCall(id=f"c{turn}", name="show_report", arguments="{}")
        state.messages.append(AssistantMessage(text=f"turn {turn}", calls=(call,), turn=turn))
        state.messages.append(ToolResult(call_id=call.id, name=call.name, content="ok"))
        folded = policy.apply(state)
        folds += folded
        sent = gpt.to_messages(
            ModelRequest(
                run_id="r",
                turn=turn + 1,
                system="Be careful.",
                messages=tuple(state.messages),
                tools=(),
                summary=state.summary,
            )
        )
        assert (sent[: len(previous)] == previous) is not folded
        previous = sent
    # The first fold at turn 5 (11 messages); each leaves 4, so the next comes 4 turns later.
    assert folds == 7
