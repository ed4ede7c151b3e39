"""Registers this directory's fixtures, defined in ``_loop_fixtures``.

A conftest is always a module named ``conftest``, and mypy checks each module name once, so
the fixtures live in a module of their own name (type-checked) and are only imported here.
"""

from _loop_fixtures import make_world, world

__all__ = ["make_world", "world"]
