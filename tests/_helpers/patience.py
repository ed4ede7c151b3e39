"""The session's patience factor, and time limits for child processes stretched by it.

``tests/conftest.py`` takes a patience factor when the session starts (at least 3,
more on a slow or loaded machine) and puts it in ``DURABLY_TEST_PATIENCE`` for the
test modules and their children. A limit on a child process is a guard against a
hang, never a measure of speed, so it stretches by the same factor.
"""

from __future__ import annotations

import os
import time

__all__ = ["patience", "stretched"]

_FLOOR = 3.0
_CEILING = 20.0
# Best of five rounds of _work() on the reference machine (2 cores, quiet), 2026-12-02.
_REFERENCE_SECONDS = 0.030


def _work() -> float:
    """Seconds one fixed piece of pure Python takes on this machine now."""
    started = time.perf_counter()
    total = 0
    for i in range(1_000_000):
        total += i * i
    return time.perf_counter() - started


def patience(parallel: int = 1) -> float:
    """How many times longer than on a quiet machine a test may take before it counts as hung.

    ``parallel`` is how many tests run at once (pytest-xdist's workers): each beyond the
    first is one more busy core the load average cannot see yet.
    """
    given = os.environ.get("DURABLY_TEST_PATIENCE")
    if given:
        return float(given)
    slower = min(_work() for _ in range(5)) / _REFERENCE_SECONDS
    busy = 1.0 + (os.getloadavg()[0] + parallel - 1) / (os.cpu_count() or 1)
    return min(_CEILING, max(_FLOOR, slower, busy))


def stretched(seconds: float) -> float:
    """``seconds`` (what a quiet machine would need, with room) times the session's patience."""
    return seconds * float(os.environ.get("DURABLY_TEST_PATIENCE", _FLOOR))
