"""Registers this directory's fixtures, defined in ``_lg_fixtures``.

A conftest is always a module named ``conftest``, and mypy checks each module name once, so
the fixtures live in a module of their own name (type-checked) and are only imported here.
The Postgres cluster helpers live with the store tests (tests/stores), put on the import
path here as pytest puts each test directory there.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "stores"))

from _lg_fixtures import lg_server, pg_cluster, pg_dsn

__all__ = ["lg_server", "pg_cluster", "pg_dsn"]
