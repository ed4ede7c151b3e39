"""Registers this directory's fixtures, defined in ``_transport_fixtures``.

A conftest is always a module named ``conftest``, and mypy checks each module name once, so
the fixtures live in a module of their own name (type-checked) and are only imported here.
"""

from _transport_fixtures import agent_files, service_dir

__all__ = ["agent_files", "service_dir"]
