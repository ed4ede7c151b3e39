"""The run page's spend chart and timeline, rendered from states built here."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from durably.console.pages import Page, run_page
from durably.state import (
    Approval,
    ApprovalKind,
    AssistantMessage,
    AttemptMarker,
    Decision,
    Phase,
    Resolution,
    ResolutionOutcome,
    RunState,
    ToolCall,
    ToolResult,
    UserMessage,
)

PAGE = Page(store="runs", root="/t/x/", read_only=True)
WHEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def replies(*dollars: float) -> list[AssistantMessage]:
    """One reply per amount, turns from 1."""
    return [AssistantMessage(text=f"t{n}", turn=n, dollars=d) for n, d in enumerate(dollars, 1)]


def a_run(messages: list, **fields: object) -> RunState:  # type: ignore[type-arg]
    """A run holding ``messages`` (after the task), its dollars the replies' sum."""
    spent = sum(m.dollars for m in messages if isinstance(m, AssistantMessage))
    return RunState(
        run_id="r1",
        task="t",
        created_at=WHEN,
        messages=[UserMessage(text="t"), *messages],
        dollars=spent,
        **fields,  # type: ignore[arg-type]
    )


def chart(page: str) -> str:
    """The spend chart's SVG."""
    found = re.search(r'<svg class="spend".*?</svg>', page, re.S)
    assert found, page
    return found.group(0)


def ticks(svg: str) -> dict[str, float]:
    """The y-axis labels, each with its height."""
    return {
        label: float(y)
        for y, label in re.findall(
            r'<text class="tick" x="[0-9.]+" y="([0-9.]+)"[^>]*>([^<]+)<', svg
        )
    }


def test_a_run_that_spent_nothing_is_labelled_zero_dollars() -> None:
    """With $0 spent the chart says $0.0000 after the last turn, and its axis shows only $0."""
    svg = chart(run_page(PAGE, a_run(replies(0, 0, 0, 0)), None))
    assert "$0.0000 after turn 4" in svg
    assert "$1.0000" not in svg
    assert list(ticks(svg)) == ["$0.0000"]


def test_the_spend_chart_has_a_y_axis_in_dollars() -> None:
    """The chart's y-axis is labelled $0, half and the top; the line ends at the top's height."""
    svg = chart(run_page(PAGE, a_run(replies(0.01, 0.02)), None))
    assert "$0.0300 after turn 2" in svg
    found = ticks(svg)
    assert list(found) == ["$0.0000", "$0.0150", "$0.0300"]
    assert found["$0.0000"] > found["$0.0150"] > found["$0.0300"]  # SVG y grows downwards
    points = re.search(r'<polyline[^>]*points="([^"]+)"', svg)
    assert points
    last_y = float(points[1].split()[-1].split(",")[1])
    assert abs(last_y + 4 - found["$0.0300"]) < 0.5  # the label sits 4 px below its tick


def positions(page: str, *texts: str) -> list[int]:
    """Where each text first appears in ``page``; each must."""
    found = [page.find(text) for text in texts]
    assert -1 not in found, list(zip(texts, found, strict=True))
    return found


def test_a_calls_approval_verdict_and_result_show_in_the_order_they_happened() -> None:
    """Approval before the attempt, the ladder's verdict after it, the result last."""
    call = ToolCall(id="c1", name="refund", arguments="{}")
    done = a_run(
        [
            AssistantMessage(text="go", turn=1, calls=(call,)),
            ToolResult(call_id="c1", name="refund", content="refunded #7"),
        ],
        approvals_given={"c1": Decision(approved=True, by="ann", decided_at=WHEN)},
        resolutions={"c1": Resolution(step=3, outcome=ResolutionOutcome.DONE, by="bob")},
    )
    order = positions(
        run_page(PAGE, done, None), "approval: approved by ann", "ladder: step 3", "refunded #7"
    )
    assert order == sorted(order)

    # Rerun by a person, in doubt again, a person asked again: the old verdict comes
    # after the approval and the attempt, before the question now waiting.
    waiting = a_run(
        [AssistantMessage(text="go", turn=1, calls=(call,))],
        phase=Phase.PAUSED,
        approvals_given={"c1": Decision(approved=True, by="ann", decided_at=WHEN)},
        markers={"c1": AttemptMarker(key="k", tool="refund", started_at=WHEN)},
        resolutions={"c1": Resolution(step=3, outcome=ResolutionOutcome.RERUN, by="bob")},
        pending={
            "c1": Approval(
                call_id="c1",
                tool="refund",
                arguments="{}",
                asked_at=WHEN,
                kind=ApprovalKind.RESOLVE,
            )
        },
    )
    timeline = run_page(PAGE, waiting, None).split("<h2>Timeline</h2>", 1)[1]
    order = positions(
        timeline,
        "approval: approved by ann",
        "attempt marker: started",
        "ladder: step 3 (a person) → rerun · answered by bob",
        "run again after the verdict",
        "waiting for a person",
    )
    assert order == sorted(order)


def test_restarts_are_marked_on_the_timeline() -> None:
    """A run that restarted shows how often, and the replies lost before their save."""
    state = a_run(replies(0.01), resumes=2, unsaved_replies=1, unsaved_dollars=0.5)
    timeline = run_page(PAGE, state, None).split("<h2>Timeline</h2>", 1)[1]
    assert re.search(
        r'<div class="restart" role="note">⟲ restarted 2 times so far; 1 model reply lost '
        r"before its save, counted at its worst case \(\$0\.5000\)",
        timeline,
    ), timeline
    assert 'class="restart"' not in run_page(PAGE, a_run(replies(0.01)), None)
