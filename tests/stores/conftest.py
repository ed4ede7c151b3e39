"""Registers this directory's fixtures, defined in ``_store_fixtures``.

A conftest is always a module named ``conftest``, and mypy checks each module name once, so
the fixtures live in a module of their own name (type-checked) and are only imported here.
"""

from _store_fixtures import any_store, every_store, pg_cluster, pg_dsn, tests_dir

__all__ = ["any_store", "every_store", "pg_cluster", "pg_dsn", "tests_dir"]
