"""Fixtures for the transport tests: the directories a scenario's processes share."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def service_dir(tmp_path: Path) -> Path:
    """Where the service keeps its effects, request log and keys."""
    path = tmp_path / "service"
    path.mkdir()
    return path


@pytest.fixture
def agent_files(tmp_path: Path) -> dict[str, str]:
    """The files every agent process of one scenario shares: run store and approver log."""
    return {"state": str(tmp_path / "runs"), "questions": str(tmp_path / "questions.jsonl")}
