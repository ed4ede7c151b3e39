"""Starting the child processes of the Postgres tests, and reading what they say."""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Self

from _helpers.patience import stretched

CHILD = Path(__file__).with_name("_pg_child.py")


class Child:
    """A child process speaking lines on stdin and stdout."""

    def __init__(self, *args: str, log: Path | None = None) -> None:
        """Start ``_pg_child.py args``; its stderr goes to ``log`` if given (else a pipe)."""
        self.log = log
        with contextlib.ExitStack() as files:
            stderr = subprocess.PIPE if log is None else files.enter_context(log.open("a"))
            self.process = subprocess.Popen(
                [sys.executable, str(CHILD), *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def line(self, timeout: float = 30) -> str:
        """The next line the child printed; fails if it exits first or says nothing in time."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(
                f"child {self.pid} said nothing for {timeout}s; its tasks and log:\n"
                + self._stacks()
            ) from None
        if line is None:
            self.process.wait(timeout=stretched(10))
            if self.process.stderr is not None:
                stderr = self.process.stderr.read()
            else:
                stderr = self.log.read_text() if self.log else ""
            raise AssertionError(f"child {self.pid} exited ({self.process.returncode}):\n{stderr}")
        return line

    def _stacks(self) -> str:
        """Ask a silent child for its tasks' stacks (SIGUSR1) and return its log's tail."""
        if self.process.poll() is not None or self.log is None:
            return "(no log: its stderr is a pipe)" if self.log is None else "(it has exited)"
        self.process.send_signal(signal.SIGUSR1)
        time.sleep(1)
        return self.log.read_text()[-20_000:]

    def json(self, timeout: float = 30) -> dict[str, Any]:
        """The next line, parsed as JSON."""
        value = json.loads(self.line(timeout))
        assert isinstance(value, dict)
        return value

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def finish(self, timeout: float = 30) -> int:
        """Close stdin and wait for the child to exit; return its exit code."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        """SIGKILL the child (if still running), wait for it, and close its pipes."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=stretched(10))
        self._reader.join(timeout=stretched(10))  # it stops at EOF; only then may stdout be closed
        for pipe in (self.process.stdin, self.process.stdout, self.process.stderr):
            if pipe is not None and not pipe.closed:
                with contextlib.suppress(OSError):
                    pipe.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.kill()

    @classmethod
    def ask(cls, *args: str) -> dict[str, Any]:
        """Run a one-shot child and return the JSON line it prints."""
        with cls(*args) as child:
            answer = child.json()
            child.finish()
            return answer
