"""The run page's spend chart and timeline, rendered from states built here."""

from __future__ import annotations

import asyncio
import re
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

from durably import Agent, Call, Effect, Limits, Reply, ScriptedModel, ToolContext, Usage, Yes, tool
from durably.console.pages import Page, run_page
from durably.decisions import AskLater
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
from durably.stores.file import FileStore

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


def budget_line(svg: str) -> float:
    """The height of the chart's budget line; it must have one."""
    found = re.search(r'<line class="budget" x1="[0-9.]+" y1="([0-9.]+)"', svg)
    assert found, svg
    return float(found[1])


def test_the_budget_is_a_line_at_its_height_on_the_axis() -> None:
    """A run with a dollar limit shows it as a line at its dollars; the axis reaches it."""
    svg = chart(run_page(PAGE, a_run(replies(0.01, 0.02), max_dollars=0.06), None))
    assert "budget $0.0600 (max_dollars)" in svg
    assert "$0.0300 after turn 2" in svg
    found = ticks(svg)
    assert list(found) == ["$0.0000", "$0.0300", "$0.0600"]
    assert abs(budget_line(svg) + 4 - found["$0.0600"]) < 0.5
    assert 'class="budget"' not in chart(run_page(PAGE, a_run(replies(0.01, 0.02)), None))


def test_the_run_records_the_dollar_limit_it_ran_with_and_the_chart_draws_it(
    tmp_path: Path,
) -> None:
    """Each process that runs the run records its max_dollars; the page draws the last one."""

    @tool(effect=Effect.KEYED, key_ttl=timedelta(hours=24), needs_approval=True)
    async def refund(ctx: ToolContext, order_id: str) -> str:
        """Refund an order."""
        return f"refunded under key {ctx.idempotency_key}"

    def agent(limit: float) -> Agent:
        model = ScriptedModel(
            [
                Reply(
                    calls=[Call(id="c1", name="refund", arguments='{"order_id": "A-1"}')],
                    usage=Usage(input_tokens=1000, output_tokens=1000),
                ),
                Reply(text="done", usage=Usage(input_tokens=1000, output_tokens=1000)),
            ]
        )
        store = FileStore(tmp_path / "runs")
        return Agent(
            model=model,
            tools=[refund],
            store=store,
            approver=AskLater(),
            limits=Limits(max_dollars=limit),
        )

    assert asyncio.run(agent(0.05).run("refund A-1", run_id="b1")).status == "paused"
    assert FileStore(tmp_path / "runs").read_sync("b1").max_dollars == 0.05
    outcome = asyncio.run(agent(0.5).resume("b1", decisions={"c1": Yes()}))
    assert outcome.status == "done"
    state = FileStore(tmp_path / "runs").read_sync("b1")
    assert state.max_dollars == 0.5
    svg = chart(run_page(PAGE, state, None))
    assert "budget $0.5000 (max_dollars)" in svg
    assert "$0.0360 after turn 2" in svg


def test_a_run_saved_before_the_limit_was_recorded_draws_no_budget_line(tmp_path: Path) -> None:
    """A checkpoint written before ``max_dollars`` existed loads without a limit and no line."""
    runs = tmp_path / "snapshot"
    shutil.copytree(Path(__file__).parents[1] / "testdata" / "main-format" / "snapshot", runs)
    runs.chmod(0o700)
    for path in runs.iterdir():
        path.chmod(0o600)
    assert "max_dollars" not in (runs / "snap-1.json").read_text()
    state = FileStore(runs).read_sync("snap-1")
    assert state.max_dollars is None
    svg = chart(run_page(PAGE, state, None))
    assert "$0.0042 after turn 5" in svg
    assert "budget" not in svg
