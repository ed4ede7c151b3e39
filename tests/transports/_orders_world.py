"""Helpers for the transport tests: start the order service, run an agent process, read logs."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _helpers.patience import stretched

HERE = Path(__file__).parent
CHILD_TIMEOUT = stretched(60)


@contextmanager
def order_service(directory: Path, *, keys: bool) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Run ``_orders_service.py`` under uvicorn on a free loopback port; yield its URL and process.

    The test binds and listens before the child starts, so requests queue in the
    socket's backlog until uvicorn accepts them: no port race, no readiness poll.
    """
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    process = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "_orders_service.py"),
            str(listener.fileno()),
            str(directory),
            "on" if keys else "off",
        ],
        pass_fds=[listener.fileno()],
    )
    listener.close()
    try:
        yield f"http://127.0.0.1:{port}", process
    finally:
        process.kill()
        process.wait(timeout=CHILD_TIMEOUT)


def run_agent(config: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """Run ``_orders_agent.py`` with ``config`` in a new process and wait for it."""
    return subprocess.run(
        [sys.executable, str(HERE / "_orders_agent.py"), json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        check=False,
    )


def jsonl(path: Path) -> list[dict[str, Any]]:
    """Every JSON line of a log the children wrote."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]
