"""Fixtures shared by the foundation tests, and time limits that stretch on a slow machine.

pytest-timeout's limits here are guards against a hung test, never a measure of
speed (speed is measured in ``benchmarks/``). A limit that held on a quiet machine
can trip on a loaded one: the issue-39 report saw a power-loss sweep pass its 120 s
at a load average of about 10. So every test's limit (the default and each
``@pytest.mark.timeout``) is multiplied by a patience factor taken when the session
starts: at least 3, more when a fixed piece of Python runs slower than it does
on a quiet machine of the reference kind, or when the load average says the cores
are already busy (``_helpers.patience.patience``). ``DURABLY_TEST_PATIENCE`` sets the
factor by hand.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from _helpers.patience import patience
from _helpers.two_users import shared_directory, throwaway_user
from durably.stores.file import FileStore

# Hypothesis judges time too: a draw over 1 s fails `too_slow`, an example over
# 200 ms fails its deadline. Both measure the machine, not the code (a loaded 2-core
# machine failed test_state's round trips that way), so the whole suite runs without
# them; what each test checks is unchanged.
settings.register_profile("durably", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("durably")


def pytest_configure(config: pytest.Config) -> None:
    """Take the session's patience once, before any test runs, and hand it on.

    The environment carries it to the test modules' limits on child processes
    (``_helpers.patience.stretched``) and to the children themselves.
    """
    # pytest-xdist has turned `-n auto` into a count by now; its workers inherit the
    # environment below and take the controller's factor.
    workers = config.getoption("numprocesses", default=None)
    factor = patience(workers if isinstance(workers, int) and workers > 0 else 1)
    config.stash[_PATIENCE] = factor
    os.environ["DURABLY_TEST_PATIENCE"] = f"{factor:.2f}"


def pytest_report_header(config: pytest.Config) -> str:
    """Say by how much the time limits were stretched."""
    factor = config.stash[_PATIENCE]
    return f"time limits x{factor:.1f} (guards against hangs; DURABLY_TEST_PATIENCE)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Stretch every test's time limit by the session's patience."""
    factor = config.stash[_PATIENCE]
    default = float(config.getini("timeout") or 0)
    for item in items:
        marker = item.get_closest_marker("timeout")
        limit = float(marker.args[0]) if marker is not None and marker.args else default
        if limit > 0:
            # Prepended, so it is the closest marker pytest-timeout reads.
            item.add_marker(pytest.mark.timeout(limit * factor), append=False)


_PATIENCE = pytest.StashKey[float]()


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


@pytest.fixture
def mallory() -> Iterator[str]:
    """A throwaway local user (the attacker of the two-user tests), removed afterwards."""
    with throwaway_user() as name:
        yield name


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every user may create files in, as /tmp."""
    with shared_directory() as path:
        yield path


_WATCHED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def _signal_setup() -> tuple[object, ...]:
    """This process's dispositions of the interactive signals, and its blocked mask."""
    return (
        *(signal.getsignal(s) for s in _WATCHED_SIGNALS),
        frozenset(signal.pthread_sigmask(signal.SIG_BLOCK, ())),
    )


@pytest.fixture(autouse=True)
def _signals_left_as_found() -> Iterator[None]:
    """A test leaves the process's signal handling as it found it.

    Children started later inherit what it leaves: a SIGINT left ignored (or blocked)
    makes every later child deaf to Ctrl-C, and a later test fails for no fault of its own.
    """
    before = _signal_setup()
    yield
    after = _signal_setup()
    assert after == before, f"signal handling changed by this test: {before} -> {after}"
