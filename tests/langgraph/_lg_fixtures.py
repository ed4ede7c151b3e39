"""Fixtures of the LangGraph saver's tests: a fork server that runs the agent in real processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _lg_server import Server


@pytest.fixture(scope="session")
def lg_server() -> Iterator[Server]:
    """One fork server for the session (it imports LangGraph once)."""
    server = Server()
    try:
        yield server
    finally:
        server.stop()
