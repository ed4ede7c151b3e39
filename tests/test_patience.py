"""The suite's time limits stretch by the session's patience (tests/conftest.py, issue 39)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _helpers.patience import stretched

CONFTEST = Path(__file__).with_name("conftest.py")

SLEEPER = """
import time

import pytest


@pytest.mark.timeout(1)
def test_sleeps_three_seconds():
    time.sleep(3)
"""


def pytest_in(tmp_path: Path, patience: str) -> subprocess.CompletedProcess[str]:
    """Run a one-test session under this suite's conftest with the patience given."""
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    shutil.copytree(CONFTEST.with_name("_helpers"), tmp_path / "_helpers")  # what it imports
    (tmp_path / "test_sleeper.py").write_text(SLEEPER)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env={**os.environ, "DURABLY_TEST_PATIENCE": patience},
        capture_output=True,
        text=True,
        timeout=stretched(300),
        check=False,
    )


def test_a_marked_limit_is_multiplied_by_the_patience(tmp_path: Path) -> None:
    """1 s x 5 lets a 3 s test pass; the header says by how much limits were stretched."""
    done = pytest_in(tmp_path, "5")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "time limits x5.0" in done.stdout


def test_a_hang_is_still_caught_past_the_stretched_limit(tmp_path: Path) -> None:
    """1 s x 2 is still shorter than the 3 s test: the guard against hangs holds."""
    done = pytest_in(tmp_path, "2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Timeout (>2.0s)" in done.stdout


def test_each_xdist_worker_beyond_the_first_counts_as_a_busy_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On an idle one-core machine five workers give a factor of five, one worker the floor."""
    from _helpers import patience as measure

    monkeypatch.delenv("DURABLY_TEST_PATIENCE", raising=False)
    monkeypatch.setattr(measure, "_work", lambda: 0.0)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert measure.patience(1) == 3.0  # the floor
    assert measure.patience(5) == 5.0
