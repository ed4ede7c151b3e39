"""Registers this directory's fixtures, defined in ``_helpers.pg_fixtures``.

The Postgres cluster helpers live with the store tests (tests/stores), put on the
import path here as pytest puts each test directory there.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "stores"))

from _helpers.pg_fixtures import pg_cluster, pg_dsn

__all__ = ["pg_cluster", "pg_dsn"]
