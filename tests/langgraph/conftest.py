"""Registers this directory's fixtures, defined in ``_lg_fixtures``.

A conftest is always a module named ``conftest``, and mypy checks each module name once, so
the fixtures live in a module of their own name (type-checked) and are only imported here.
"""

from _lg_fixtures import lg_server

__all__ = ["lg_server"]
