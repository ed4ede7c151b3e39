"""Fixtures of the LangGraph saver's tests: a fork server, and a throwaway PostgreSQL cluster.

The cluster and the schema per test are the agent adapters' (``_helpers.pg_fixtures``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _lg_server import Server

from _helpers.pg_fixtures import pg_cluster, pg_dsn

__all__ = ["lg_server", "pg_cluster", "pg_dsn"]


@pytest.fixture(scope="session")
def lg_server() -> Iterator[Server]:
    """One fork server for the session (it imports LangGraph once)."""
    server = Server()
    try:
        yield server
    finally:
        server.stop()
