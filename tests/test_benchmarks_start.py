"""Every benchmark starts: its imports resolve when it is run as the README says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from _helpers.patience import stretched

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_"))


def test_the_benchmarks_are_found() -> None:
    """The glob sees the benchmarks (an empty list would pass every test below)."""
    assert "postgres.py" in SCRIPTS
    assert len(SCRIPTS) >= 10


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_benchmark_shows_its_help(script: str) -> None:
    """``python benchmarks/NAME.py --help`` from the checkout exits 0 with a usage line.

    A benchmark runs on demand, never in the suite; this keeps it runnable (an import
    that moved, a helper it reaches for in tests/) without measuring anything.
    """
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--help"],
        cwd=BENCHMARKS.parent,
        capture_output=True,
        text=True,
        timeout=stretched(60),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
