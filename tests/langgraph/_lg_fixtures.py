"""Fixtures of the LangGraph saver's tests: a fork server, and a throwaway PostgreSQL cluster."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import psycopg
import pytest
from _lg_server import Server
from _pg_cluster import Cluster


@pytest.fixture(scope="session")
def lg_server() -> Iterator[Server]:
    """One fork server for the session (it imports LangGraph once)."""
    server = Server()
    try:
        yield server
    finally:
        server.stop()


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
