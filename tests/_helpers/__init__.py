"""Helpers the tests share: sample states and the child processes that crash for real."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHILD = Path(__file__).with_name("child.py")


def run_child(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``child.py`` with ``args`` in a fresh Python process and wait for it."""
    return subprocess.run(
        [sys.executable, str(CHILD), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_child(*args: str) -> subprocess.Popen[str]:
    """Start ``child.py`` with ``args``; the caller talks to it over stdin and stdout."""
    return subprocess.Popen(
        [sys.executable, str(CHILD), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
