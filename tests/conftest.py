"""Fixtures shared by the foundation tests: a state directory and a file store on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from durably.stores.file import FileStore


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    """Where a test's file store keeps its runs (not created yet)."""
    return tmp_path / "runs"


@pytest.fixture
def store(state_dir: Path) -> Iterator[FileStore]:
    """A file store with sync on, as users get it."""
    store = FileStore(state_dir)
    yield store
    store.close_sync()
