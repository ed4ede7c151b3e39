"""``durably console`` in a real process, for the tests that talk to it over sockets."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from _helpers.patience import stretched

DURABLY = [sys.executable, "-m", "durably"]

SERVE = (
    "import sys; from pathlib import Path; from durably.console.server import serve; "
    "from durably.storechoice import StoreChoice; "
    "serve(StoreChoice(directory=Path(sys.argv[1])), port=0, "
    "header_timeout=float(sys.argv[2]), max_connections=int(sys.argv[3]))"
)
"""A console started through ``serve`` itself, with its connection bounds as arguments."""


class Console:
    """A console process; ``url`` is the address it printed (it carries the token)."""

    def __init__(
        self, cwd: Path, *args: str, env: dict[str, str] | None = None, command: Sequence[str] = ()
    ) -> None:
        base = {k: v for k, v in os.environ.items() if k != "DURABLY_DSN"}
        self.process = subprocess.Popen(
            [*command] if command else [*DURABLY, "console", *args, "--port", "0"],
            cwd=cwd,
            env={**base, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], 30)
        assert ready, "the console printed no address"
        line = self.process.stdout.readline()
        assert "http://" in line, line
        self.url = line[line.index("http://") :].strip()
        self.base = self.url.split("?", 1)[0].rstrip("/")
        self.port = int(self.url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        self.output = ""

    def stop(self) -> str:
        """Stop the console; what it wrote after the address line."""
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=stretched(10))
        assert self.process.stdout is not None
        if not self.process.stdout.closed:
            self.output = self.process.stdout.read()
            self.process.stdout.close()
        return self.output
