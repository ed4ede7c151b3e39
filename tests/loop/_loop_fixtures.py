"""Fixtures for the loop tests: worlds in temp directories, built fresh for every scenario."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _loop_world import World


@pytest.fixture
def make_world(tmp_path: Path) -> Iterator[Callable[[str], World]]:
    """Builds a fresh world under the test's temp directory; each name gives a new one."""
    worlds: list[World] = []

    def make(name: str) -> World:
        world = World.make(tmp_path / name)
        worlds.append(world)
        return world

    yield make
    for world in worlds:
        world.close()


@pytest.fixture
def world(make_world: Callable[[str], World]) -> World:
    """One fresh world: state directory, workspace, receiver ledger, logs and a clock."""
    return make_world("world")
