"""The README's programs are the files in ``examples/``, and they run as written."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from _helpers.patience import stretched

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
_TAGGED_BLOCK = re.compile(r"<!-- (examples/[\w.-]+\.py) -->\n```python\n(.*?)```\n", re.S)


def readme_programs() -> dict[str, str]:
    """Each README block tagged ``<!-- examples/NAME.py -->``, by the file it must equal."""
    return dict(_TAGGED_BLOCK.findall(README.read_text()))


def run_example(
    path: Path, cwd: Path, *, stdin: str = "", plan: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run an example as a script in ``cwd``.

    ``plan`` is the keyword arguments of a ``faults.CrashPlan`` to run it under
    (``label='loop.saved.reply', occurrence=2``: SIGKILL there); every crash point
    reached goes to stderr as a JSON list when the program ends.
    """
    command = [sys.executable, str(path)]
    if plan is not None:
        command = [
            sys.executable,
            "-c",
            "import json, runpy, sys\n"
            "from durably import faults\n"
            f"with faults.installed(faults.CrashPlan({plan})) as plan:\n"
            "    runpy.run_path(sys.argv[1], run_name='__main__')\n"
            "print(json.dumps(plan.reached), file=sys.stderr)\n",
            str(path),
        ]
    return subprocess.run(
        command,
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=stretched(60),
        check=False,
    )


def test_every_python_block_of_the_readme_is_an_example_file_byte_for_byte() -> None:
    """Every README Python block is tagged with its examples/ file and equals it exactly."""
    text = README.read_text()
    blocks = text.count("```python\n")
    programs = readme_programs()

    assert blocks == len(programs), "a ```python block in the README has no examples/ tag"
    assert set(programs) <= {f"examples/{path.name}" for path in EXAMPLES}
    for name, body in programs.items():
        assert body == (ROOT / name).read_text(), f"README block differs from {name}"


def test_every_example_is_shown_in_the_readme_or_a_doc() -> None:
    """No example sits unread: each is a README block or named by a page in docs/."""
    docs = "\n".join(page.read_text() for page in (ROOT / "docs").glob("*.md"))
    shown = set(readme_programs())
    for path in EXAMPLES:
        name = f"examples/{path.name}"
        assert name in shown or name in docs, f"{name} is in no README block and no doc"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_every_example_runs_to_its_end(path: Path, tmp_path: Path) -> None:
    """Each program in examples/ runs as a script, a person answering yes, and exits 0."""
    result = run_example(path, tmp_path, stdin="y\n" * 5)

    assert result.returncode == 0, result.stdout + result.stderr


def test_the_refund_example_refunds_once_and_a_rerun_returns_the_saved_answer(
    tmp_path: Path,
) -> None:
    """The refund example ends done with one refund; run again, it only reports the saved run."""
    example = ROOT / "examples" / "refunds.py"

    first = run_example(example, tmp_path, stdin="y\n")
    again = run_example(example, tmp_path)  # nothing on stdin: no question may be asked

    assert first.returncode == 0, first.stdout + first.stderr
    assert "Approve refund (keyed)?" in first.stdout
    assert first.stdout.endswith("refund-order-1042: done: Order 1042 is refunded.\n")
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout == "refund-order-1042: done: Order 1042 is refunded.\n"
    refunds = json.loads((tmp_path / "refund-demo" / "payments.json").read_text())
    assert list(refunds.values()) == ["refund 1: 500 cents, 1042"]


def test_the_refund_example_killed_after_the_refund_finds_its_run_and_refunds_once(
    tmp_path: Path,
) -> None:
    """Killed after the refund, before its result was saved: `durably runs` lists the run by
    the caller's ID, and the rerun settles the call with the same key, so one refund exists.
    """
    example = ROOT / "examples" / "refunds.py"

    crashed = run_example(example, tmp_path, stdin="y\n", plan="label='loop.tool_returned:refund'")
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
    listed = subprocess.run(
        [sys.executable, "-m", "durably", "runs", "--state", "refund-demo"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=stretched(60),
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    resumed = run_example(example, tmp_path)  # the approval was saved with the marker

    assert listed.returncode == 0, listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if "refund-order-1042" in line]
    assert [cell.strip() for cell in row.strip("│ ").split("│")][:2] == [
        "refund-order-1042",
        "tools",
    ]
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert resumed.stdout == "refund-order-1042: done: Order 1042 is refunded.\n"
    refunds = json.loads((tmp_path / "refund-demo" / "payments.json").read_text())
    assert list(refunds.values()) == ["refund 1: 500 cents, 1042"]


@pytest.mark.slow
def test_the_refund_example_killed_at_every_point_of_the_loop_ends_with_one_refund(
    tmp_path: Path,
) -> None:
    """Killed by SIGKILL at each of the loop's crash points in turn (every save point, each
    reply's arrival, the refund's return) and run again, the refund example ends done,
    with exactly one refund at the service (the stores' own crash points have their tests).
    """
    example = ROOT / "examples" / "refunds.py"
    recorded = run_example(example, tmp_path, stdin="y\n", plan="")
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    reached = json.loads(recorded.stderr.splitlines()[-1])
    seen: Counter[str] = Counter()
    points = []
    for label in reached:
        seen[label] += 1
        if label.startswith("loop."):
            points.append((label, seen[label]))
    assert {"loop.saved.attempt", "loop.tool_returned:refund", "loop.saved.result"} <= seen.keys()

    for label, occurrence in points:
        world = tmp_path / f"{label}-{occurrence}"
        world.mkdir()
        plan = f"label={label!r}, occurrence={occurrence}"
        first = run_example(example, world, stdin="y\n", plan=plan)
        assert first.returncode == -signal.SIGKILL, f"{plan}: {first.stdout}{first.stderr}"
        # A kill before the yes was saved asks again; a kill after it asks nothing.
        again = run_example(example, world, stdin="y\n")

        assert again.returncode == 0, f"{plan}: {again.stdout}{again.stderr}"
        assert again.stdout.endswith("refund-order-1042: done: Order 1042 is refunded.\n")
        refunds = json.loads((world / "refund-demo" / "payments.json").read_text())
        assert list(refunds.values()) == ["refund 1: 500 cents, 1042"], plan


@pytest.mark.parametrize("label", ["loop.saved.attempt", "loop.tool_returned:refund"])
def test_the_pydantic_ai_example_killed_mid_refund_refunds_once_when_run_again(
    tmp_path: Path, label: str
) -> None:
    """The Pydantic AI example killed by SIGKILL around its refund, run again, finishes with
    one refund and the model's answer.
    """
    example = ROOT / "examples" / "pydantic_ai_refund.py"

    crashed = run_example(example, tmp_path, plan=f"label={label!r}")
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
    again = run_example(example, tmp_path)

    assert again.returncode == 0, again.stdout + again.stderr
    assert "Refunded 500 cents on order 1042. (1 refund in the service)" in again.stdout
