"""A second local user for the tests that try what another user of the machine could do.

The test (root in CI) is the victim; a throwaway user made with ``useradd`` and
removed afterwards is the attacker, acting through ``runuser``. The fixtures
``mallory`` (that user's name) and ``shared`` (a 1777 directory, as /tmp) are
registered in ``tests/conftest.py``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from _helpers.patience import stretched

__all__ = ["NEEDS_TWO_USERS", "as_user", "shared_directory", "throwaway_user"]

NEEDS_TWO_USERS = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("runuser") is None,
    reason="needs root with useradd and runuser to make a second user (CI has them)",
)


@contextmanager
def throwaway_user() -> Iterator[str]:
    """A new system user with no home and no shell, removed afterwards."""
    name = f"durably-t{secrets.token_hex(3)}"
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True,
    )
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False)


@contextmanager
def shared_directory() -> Iterator[Path]:
    """A directory every user may create files in (mode 1777, as /tmp), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="durably-shared-"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def as_user(user: str, script: str) -> subprocess.CompletedProcess[str]:
    """Run a shell script as ``user`` (bounded: a hang guard, not a clock)."""
    return subprocess.run(
        ["runuser", "-u", user, "--", "sh", "-c", script],
        capture_output=True,
        text=True,
        check=False,
        timeout=stretched(120),
    )
