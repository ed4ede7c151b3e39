"""Fixtures of the store tests: a throwaway PostgreSQL cluster, a fresh schema per test,
``any_store``, which runs a test once per store backend, and ``every_store``, which runs the
conformance suite once per store durably ships.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from _pg_cluster import Cluster
from _store_backends import Backend, file_backend, postgres_backend

from durably.langgraph._thread import ThreadStore
from durably.stores.directory import DirectoryStore
from durably.stores.journal import JournalStore


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """A PostgreSQL cluster for the whole session, started with initdb/pg_ctl, removed after."""
    cluster = Cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg_dsn(pg_cluster: Cluster) -> str:
    """A DSN whose tables land in a schema of their own: each test sees an empty database."""
    schema = f"t_{secrets.token_hex(6)}"
    pg_cluster.wait_ready()
    with psycopg.connect(pg_cluster.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return f"{pg_cluster.dsn} options='-c search_path={schema}'"


STORES: dict[str, Callable[[pytest.FixtureRequest], Backend]] = {
    "file": lambda request: file_backend(request.getfixturevalue("tmp_path") / "runs"),
    "journal": lambda request: file_backend(
        request.getfixturevalue("tmp_path") / "runs", JournalStore
    ),
    "postgres": lambda request: postgres_backend(request.getfixturevalue("pg_dsn")),
}
"""The store backends of the runs' own layouts, which the property tests run against."""


def _implements_store(cls: type) -> bool:
    """Whether a class has every method of the ``Store`` protocol."""
    members = ("create", "open", "read", "list_runs", "describe", "close", "__aenter__")
    return all(callable(getattr(cls, name, None)) for name in members)


EVERY_STORE: dict[str, Callable[[pytest.FixtureRequest], Backend]] = {
    **STORES,
    "directory": lambda request: file_backend(
        request.getfixturevalue("tmp_path") / "runs", DirectoryStore
    ),
}
"""Every store durably ships, for the conformance suite (``durably.testing.stores``)."""
if _implements_store(ThreadStore):  # today by inheriting the journal store's runs
    EVERY_STORE["langgraph-thread"] = lambda request: file_backend(
        request.getfixturevalue("tmp_path") / "threads", ThreadStore
    )

_MARKS = {"postgres": [pytest.mark.postgres]}


@pytest.fixture(params=[pytest.param(name, marks=_MARKS.get(name, [])) for name in STORES])
def any_store(request: pytest.FixtureRequest) -> Backend:
    """One store backend, fresh and empty, with hooks to plant and read its raw bytes."""
    return STORES[request.param](request)


@pytest.fixture(params=[pytest.param(name, marks=_MARKS.get(name, [])) for name in EVERY_STORE])
def every_store(request: pytest.FixtureRequest) -> Backend:
    """One store durably ships, fresh and empty, with hooks to plant and read its raw bytes."""
    return EVERY_STORE[request.param](request)


@pytest.fixture
def tests_dir() -> Path:
    """The directory of these tests (children run scripts from here)."""
    return Path(__file__).parent
