"""The sweep of a Pydantic AI agent with ``Durable``: its table is kept in tests/testdata.

The same sweep, judge and table as durably's own loop (``durably.sweep``): real
SIGKILL at every crash point, depth 1 and 2, keys honoured and ignored, a fickle
model, lookups off, and the two baselines that must fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _pai_world import PydanticAIJob

from _helpers.adapter_checks import check_sweep
from durably.sweep import CONFIGS, run_sweep

REFERENCE = Path(__file__).parent.parent / "testdata" / "sweep-pydantic-ai.txt"

SWEPT = [c for c in CONFIGS if c.name != "no refile guard"]
"""Every default configuration but the tracker's refile guard (this world has no tracker)."""


@pytest.mark.slow
@pytest.mark.timeout(1200)  # about 50 s with 2 workers on an idle 2-core machine
def test_the_pydantic_ai_sweep_matches_the_table_in_the_repository() -> None:
    """Killed at every crash point, twice over, the Pydantic AI run never repeats or loses
    an effect nor pays twice for a saved reply; the baselines show duplicates and losses.
    """
    report = run_sweep(PydanticAIJob(), configs=SWEPT, depth=2, jobs=2)
    check_sweep(report, REFERENCE)
