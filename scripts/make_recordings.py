"""Write the triage tasks' replay recordings from their ground truth.

The recordings are authored, not captured: each turn is written here in the
shape a tool-using model's reply takes (short reasoning text, tool calls with
provider-style call IDs, plausible usage), driven by the task's expected.json.
Run it after changing a task; the JSON it writes is reviewed like code.

    .venv/bin/python scripts/make_recordings.py
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

from durably.models.replay import (
    RecordedCall,
    RecordedPrice,
    RecordedTurn,
    Recording,
    save_recording,
)
from durably.state import Usage
from durably.triage.world import TASKS, load_task

OUT = Path(__file__).resolve().parents[1] / "src/durably/triage/recordings"
MODEL = "claude-sonnet-4-5-20250929"
# Anthropic's published list price for Claude Sonnet 4.5, dollars per million tokens.
PRICE = RecordedPrice(input=3.0, output=15.0)
_B62 = string.ascii_letters + string.digits


class Script:
    """One task's recording, turn by turn, with IDs and usage drawn from a seeded generator."""

    def __init__(self, task: str) -> None:
        # Seeded by the task's name: the same recording every time (not for secrets).
        self.rng = random.Random(task)  # noqa: S311 -- reproducible, not cryptographic
        self.turns: list[RecordedTurn] = []
        self.context = 1900

    def call_id(self) -> str:
        """A provider-style tool call ID."""
        return "toolu_01" + "".join(self.rng.choice(_B62) for _ in range(22))

    def turn(self, text: str | None, *calls: tuple[str, dict[str, object]]) -> None:
        """Record one reply: its text, its calls, and usage that grows with the context."""
        recorded = tuple(
            RecordedCall(id=self.call_id(), name=name, arguments=json.dumps(args))
            for name, args in calls
        )
        out = len(text or "") // 4 + sum(len(c.arguments) // 3 for c in recorded) + 24
        self.context += out + 350 + self.rng.randrange(80, 900)
        usage = Usage(input_tokens=self.context, output_tokens=out)
        self.turns.append(RecordedTurn(text=text, calls=recorded, usage=usage))


def build(name: str) -> Recording:
    """The recording of task ``name``, from its ground truth."""
    task = load_task(name)
    s = Script(name)
    groups = task.groups
    s.turn(
        "I'll start by listing the crash reports in this batch.",
        ("list_reports", {}),
    )
    firsts = [g.reports[0] for g in groups] if len(groups) > 1 else list(groups[0].reports[:2])
    s.turn(
        f"There are {len(task.reports)} reports. Let me read "
        + " and ".join(firsts)
        + " in full to see the inputs and where they fail.",
        *[("show_report", {"report_id": r}) for r in firsts],
    )
    paths = sorted({g.patch.path for g in groups})
    s.turn(
        "The tracebacks point into " + ", ".join(paths) + ". Reading the code there.",
        *[("read_code", {"path": p}) for p in paths],
    )
    s.turn(
        "Before filing anything, I'll check the tracker for existing issues.",
        *[("search_issues", {"query": g.cause.replace("-", " ")}) for g in groups],
    )
    numbers = {}
    filings = []
    for n, g in enumerate(groups, 1):
        numbers[g.cause] = n
        body = (
            f"Root cause `{g.cause}` in {g.patch.path}.\n\n"
            f"Reports: {', '.join(g.reports)}.\n\n"
            f"All of them crash in the same place; see the tracebacks in the reports."
        )
        title = g.cause.replace("-", " ").capitalize() + " crashes"
        filings.append(
            (
                "file_issue",
                {"title": title, "body": body, "cause": g.cause, "reports": list(g.reports)},
            )
        )
    s.turn(
        f"Nothing is filed yet. The reports fall into {len(groups)} root cause"
        + ("s" if len(groups) > 1 else "")
        + "; filing one issue per cause.",
        *filings,
    )
    if name == "m2-due-date-zulu":
        g = groups[0]
        late = g.reports[-1]
        s.turn(
            f"{late} uses a due time without seconds ('06:45Z'), which might be a separate "
            "parsing path. Filing it on its own to be safe.",
            (
                "file_issue",
                {
                    "title": "Due time without seconds crashes",
                    "body": f"Reports: {late}.",
                    "cause": g.cause,
                    "reports": [late],
                },
            ),
        )
        s.turn(
            f"The tracker refused: the cause is already filed as #1. I'll add {late} to "
            "that issue instead of filing a duplicate.",
            (
                "comment_issue",
                {"number": 1, "body": f"Also seen in {late} (time without seconds)."},
            ),
        )
    s.turn(
        "Now a regression test per cause that reproduces the crash.",
        *[
            ("write_test", {"path": g.regression_test.path, "content": g.regression_test.content})
            for g in groups
        ],
    )
    s.turn(
        "Running the suite to confirm the new tests fail on the current code.", ("run_tests", {})
    )
    s.turn(
        "The new tests fail as expected. Applying the smallest fix for each cause.",
        *[
            ("code_patch", {"path": g.patch.path, "old": g.patch.old, "new": g.patch.new})
            for g in groups
        ],
    )
    s.turn("Re-running the suite.", ("run_tests", {}))
    s.turn(
        "Everything passes. Noting the fix on each issue.",
        *[
            (
                "comment_issue",
                {
                    "number": numbers[g.cause],
                    "body": f"Fixed in {g.patch.path}; regression test {g.regression_test.path}.",
                },
            )
            for g in groups
        ],
    )
    lines = [f"Triage of {len(task.reports)} crash reports done:"]
    for g in groups:
        lines.append(
            f"- #{numbers[g.cause]} {g.cause}: {', '.join(g.reports)}; fixed in {g.patch.path}, "
            f"covered by {g.regression_test.path}."
        )
    lines.append("The whole test suite passes.")
    s.turn("\n".join(lines))
    return Recording(model=MODEL, price=PRICE, task=task.description, turns=s.turns)


def main() -> None:
    """Write every task's recording."""
    OUT.mkdir(exist_ok=True)
    for name in TASKS:
        save_recording(build(name), OUT / f"{name}.json")
        print(f"wrote {OUT / (name + '.json')}")


if __name__ == "__main__":
    main()
