"""The client of the fork server ``_lg_child.py``, which runs the agent in real processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from _helpers.patience import stretched

HERE = Path(__file__).parent


class Server:
    """Talks to ``_lg_child.py``: one JSON command out, one JSON answer back."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "_lg_child.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=HERE,
        )
        self._answer()

    def ask(self, **command: Any) -> dict[str, Any]:
        """Send a command; its answer."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        return self._answer()

    def _answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the fork server died (exit {self.process.wait()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def stop(self) -> None:
        """Close its stdin and wait for it."""
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.close()
        self.process.wait(timeout=stretched(30))
        self.process.stdout.close()
