"""docs/agent-authors.md's twenty-line sweep runs as a user's own test suite would run it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from _helpers.patience import stretched

PAGE = Path(__file__).resolve().parent.parent / "docs" / "agent-authors.md"
_BLOCK = re.compile(r"<!-- sweep-example: [^>]*-->\n```python\n(.*?)```\n", re.S)
SENDS = "key=ctx.idempotency_key)"


def example() -> str:
    """The page's sweep example, as written."""
    (block,) = _BLOCK.findall(PAGE.read_text())
    return str(block)


def run_suite(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    """Run ``source`` as a user's test file with pytest, in a fresh process."""
    test = tmp_path / "test_refund_agent.py"
    test.write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
        cwd=tmp_path,
        # Under CI (its CI or BUILD_NUMBER variable) pytest prints a failure's text again
        # in full in its summary: the user's own run reads the same on every machine.
        env={k: v for k, v in os.environ.items() if k not in ("CI", "BUILD_NUMBER")},
        capture_output=True,
        text=True,
        timeout=stretched(600),
        check=False,
    )


def test_the_example_is_twenty_lines() -> None:
    """The sweep of a user's agent, imports and test included, fits in twenty lines."""
    lines = [line for line in example().splitlines() if line.strip()]
    assert len(lines) <= 20, len(lines)
    assert SENDS in example()


@pytest.mark.timeout(600)
def test_the_pages_sweep_passes_for_a_tool_that_sends_its_key(tmp_path: Path) -> None:
    """Run as the page writes it (the refund sends ``ctx.idempotency_key``), the sweep passes."""
    done = run_suite(tmp_path, example())

    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


@pytest.mark.timeout(600)
def test_the_pages_sweep_catches_a_keyed_tool_that_ignores_its_key(tmp_path: Path) -> None:
    """The same test with the refund sending no key fails: the ``keys ignored`` row shows the
    second refund, and the failure names ``KeyNotSent`` and the tool.
    """
    done = run_suite(tmp_path, example().replace(SENDS, "key=None)"))

    assert done.returncode == 1, done.stdout + done.stderr
    rows = re.findall(r"keys ignored\s+([12])\s+(\d+)\s+\d+\s+(\d+)\s+(\d+)", done.stdout)
    assert [depth for depth, *_ in rows] == ["1", "2"], done.stdout
    for _depth, scenarios, finished, duplicates in rows:
        assert int(finished) == int(scenarios) > 0
        assert int(duplicates) > 0
    assert "KeyNotSent: keyed tool 'refund' returned without reading" in done.stdout
