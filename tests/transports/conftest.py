"""Registers this directory's fixtures, defined in ``_transport_fixtures``.

A conftest is always a module named ``conftest``, and mypy checks each module name once, so
the fixtures live in a module of their own name (type-checked) and are only imported here.
The Postgres cluster fixtures live with the store tests (tests/stores), put on the import
path here as pytest puts each test directory there.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "stores"))

from _store_fixtures import pg_cluster, pg_dsn
from _transport_fixtures import agent_files, service_dir

__all__ = ["agent_files", "pg_cluster", "pg_dsn", "service_dir"]
