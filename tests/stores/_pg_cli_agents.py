"""Registers the ledger job with ``durably.postgres.register``, for ``durably worker --import``.

The job's world is the directory in ``$DURABLY_TEST_ROOT``.
"""

from __future__ import annotations

import os
from pathlib import Path

from _pg_jobs import JOB, make_agent

import durably.postgres

_root = Path(os.environ["DURABLY_TEST_ROOT"])
durably.postgres.register(
    JOB, lambda run_id: make_agent(_root, dwell=0.05), task="settle the ledger"
)
