"""Time limits for child processes, stretched as the session's test time limits are.

``tests/conftest.py`` takes a patience factor when the session starts (at least 3,
more on a slow or loaded machine) and puts it in ``DURABLY_TEST_PATIENCE`` for the
test modules and their children. A limit on a child process is a guard against a
hang, never a measure of speed, so it stretches by the same factor.
"""

from __future__ import annotations

import os

__all__ = ["stretched"]


def stretched(seconds: float) -> float:
    """``seconds`` (what a quiet machine would need, with room) times the session's patience."""
    return seconds * float(os.environ.get("DURABLY_TEST_PATIENCE", "3"))
