"""LangGraph's own conformance suite (``langgraph-checkpoint-conformance``) against DurablySaver."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import (
    BASE_CAPABILITIES,
    EXTENDED_CAPABILITIES,
)
from langgraph.checkpoint.memory import InMemorySaver

from durably.langgraph import DurablySaver


def test_durably_saver_passes_all_eight_capabilities(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """DurablySaver passes every base and every extended capability of LangGraph's suite: 8/8."""
    made: list[Path] = []

    async def saver() -> AsyncIterator[DurablySaver]:
        directory = tmp_path / f"suite-{len(made)}"
        made.append(directory)
        async with DurablySaver(directory) as durable:
            yield durable

    registered = checkpointer_test(name="DurablySaver")(saver)
    report = asyncio.run(validate(registered))
    with capsys.disabled():  # the report belongs in CI's log, passed or not
        report.print_report()
    results = report.results
    failures = {name: r.failures for name, r in results.items() if r.failures}
    assert not failures, failures
    passed = {name for name, r in results.items() if r.passed}
    assert passed == {c.value for c in BASE_CAPABILITIES | EXTENDED_CAPABILITIES}
    assert len(passed) == 8
    assert report.passed_all()
    assert len(made) == 8, "each capability ran on a fresh saver"


def test_in_memory_saver_implements_none_of_the_extended_three() -> None:
    """The same suite finds LangGraph's InMemorySaver at 5/5 base, 0/3 extended (the contrast)."""

    async def saver() -> AsyncIterator[InMemorySaver]:
        yield InMemorySaver()

    report = asyncio.run(validate(checkpointer_test(name="InMemorySaver")(saver)))
    report.print_report()
    passed = {name for name, r in report.results.items() if r.passed}
    assert passed == {c.value for c in BASE_CAPABILITIES}
    assert not any(report.results[c.value].detected for c in EXTENDED_CAPABILITIES)


def test_postgres_thread_saver_passes_all_eight_capabilities(
    pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """PostgresThreadSaver passes every base and extended capability of LangGraph's suite: 8/8."""
    import psycopg

    from durably.langgraph import PostgresThreadSaver

    made: list[str] = []

    async def saver() -> AsyncIterator[PostgresThreadSaver]:
        # A schema per capability, as the file saver gets a directory per capability.
        schema = f"{pg_dsn.rsplit('search_path=', 1)[1].rstrip(chr(39))}_{len(made)}"
        made.append(schema)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        dsn = pg_dsn.rsplit("search_path=", 1)[0] + f"search_path={schema}'"
        async with PostgresThreadSaver(dsn) as durable:
            yield durable

    registered = checkpointer_test(name="PostgresThreadSaver")(saver)
    report = asyncio.run(validate(registered))
    with capsys.disabled():  # the report belongs in CI's log, passed or not
        report.print_report()
    failures = {name: r.failures for name, r in report.results.items() if r.failures}
    assert not failures, failures
    passed = {name for name, r in report.results.items() if r.passed}
    assert passed == {c.value for c in BASE_CAPABILITIES | EXTENDED_CAPABILITIES}
    assert len(passed) == 8
    assert report.passed_all()
    assert len(made) == 8, "each capability ran on a fresh saver"
