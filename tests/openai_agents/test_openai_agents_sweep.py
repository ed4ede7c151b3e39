"""The sweep of an OpenAI Agents SDK agent run by ``DurableRunner``: its table is in tests/testdata.

The same sweep, judge and table as durably's own loop (``durably.sweep``): real
SIGKILL at every crash point, keys honoured and ignored, a fickle model, lookups
off, and the two baselines that must fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _oai_world import OpenAIAgentsJob

from _helpers.adapter_checks import check_sweep
from durably.sweep import CONFIGS, run_sweep

REFERENCE = Path(__file__).parent.parent / "testdata" / "sweep-openai-agents.txt"

DEPTH = 2
"""A second crash during the first restart's recovery, as durably's own sweep."""

SWEPT = [c for c in CONFIGS if c.name != "no refile guard"]
"""Every default configuration but the tracker's refile guard (this world has no tracker)."""


@pytest.mark.slow
@pytest.mark.timeout(1800)  # about 150 s with 2 workers on a loaded 2-core machine
def test_the_openai_agents_sweep_matches_the_table_in_the_repository() -> None:
    """Killed at every crash point, the SDK run never repeats or loses an effect nor pays
    twice for a saved reply; the baselines show duplicates and losses.
    """
    report = run_sweep(OpenAIAgentsJob(), configs=SWEPT, depth=DEPTH, jobs=2)
    check_sweep(report, REFERENCE)
