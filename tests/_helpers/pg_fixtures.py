"""Fixtures of the agent adapters' tests: a throwaway PostgreSQL cluster and a schema per test.

``_pg_cluster`` lives with the store tests (tests/stores); each adapter's conftest
puts that directory on the import path before importing this module.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import psycopg
import pytest
from _pg_cluster import Cluster


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """A PostgreSQL cluster for the session, started with initdb/pg_ctl, removed after."""
    cluster = Cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg_dsn(pg_cluster: Cluster) -> str:
    """A DSN whose tables land in a schema of their own."""
    schema = f"t_{secrets.token_hex(6)}"
    pg_cluster.wait_ready()
    with psycopg.connect(pg_cluster.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return f"{pg_cluster.dsn} options='-c search_path={schema}'"
