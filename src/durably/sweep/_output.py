"""What a sweep's worker processes and their children print, kept off the terminal.

A sweep provokes a run's warnings on purpose (a reply lost before its save)
in thousands of processes; printed, they would scroll over the progress bar
and bury the report. Inside :func:`captured`, each worker forked afterwards
points its standard error at a file of its own, which every process it forks
inherits, and the ``durably`` logger of every scenario's process writes its
records there, one line each. The caller reads the files once the sweep is
over (or interrupted) and prints a count of each kind of line instead.

Outside :func:`captured` (a sweep in a user's test suite), nothing is
redirected and a scenario's process drops the ``durably`` logger's records
(a handler the user configured still receives them).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ChildOutput", "captured", "scenario_logging", "worker_started"]

_directory: Path | None = None
"""Where workers started now put their standard error (set by :func:`captured`)."""
_redirected = False
"""This process's standard error is a capture file (it is a worker, or a worker's child)."""

_HANDLER = "durably-sweep-scenario"
"""The name of the handler :func:`scenario_logging` adds (once per process tree)."""
_RECORD = re.compile(r"^(?P<level>WARNING|ERROR|CRITICAL) (?P<logger>durably[\w.]*): (?P<text>.*)$")
_PYTHON_WARNING = re.compile(r"^\S+:\d+: (?P<kind>\w*Warning): (?P<text>.*)$")


@dataclass
class ChildOutput:
    """The lines the sweep's processes wrote, by kind; filled in when :func:`captured` ends."""

    warnings: Counter[str] = field(default_factory=Counter)
    """``durably`` log records and Python warnings, by text with numbers as ``N``."""
    tracebacks: Counter[str] = field(default_factory=Counter)
    """Tracebacks, by their last line."""
    other: int = 0
    """Lines of any other kind."""
    log: Path | None = None
    """Everything, kept in a file (None when nothing was written)."""

    def summary(self) -> list[str]:
        """What to print: a line per total, the commonest texts under it, where the rest is."""
        lines = []
        if self.warnings:
            lines.append(f"children's warnings: {self.warnings.total()} (counted, not shown)")
            lines += [f"  {n} x {text}" for text, n in self.warnings.most_common(5)]
        if self.tracebacks:
            lines.append(f"children's tracebacks: {self.tracebacks.total()}")
            lines += [f"  {n} x {text}" for text, n in self.tracebacks.most_common(5)]
        if self.other:
            lines.append(f"children's other output: {self.other} lines")
        if lines and self.log is not None:
            lines.append(f"children's output in full: {self.log}")
        return lines

    def read(self, directory: Path) -> None:
        """Count every capture file's lines and keep them all in one file under the temp dir."""
        texts = [p.read_text(errors="replace") for p in sorted(directory.glob("*.log"))]
        whole = "".join(texts)
        if not whole:
            return
        for text in texts:
            self._count(text.splitlines())
        fd, name = tempfile.mkstemp(prefix="durably-sweep-children-", suffix=".log")
        with os.fdopen(fd, "w") as out:
            out.write(whole)
        self.log = Path(name)

    def _count(self, lines: list[str]) -> None:
        in_traceback = False
        for line in lines:
            if line.startswith("Traceback (most recent call last)"):
                in_traceback = True
            elif in_traceback and not line.startswith((" ", "\t")):
                # The exception's line ends the traceback ("During handling" chains go on).
                if not line.startswith("During handling") and line.strip():
                    self.tracebacks[_numbers(line)] += 1
                    in_traceback = False
            elif in_traceback:
                continue
            elif record := _RECORD.match(line):
                self.warnings[_numbers(record["text"])] += 1
            elif warning := _PYTHON_WARNING.match(line):
                self.warnings[f"{warning['kind']}: {_numbers(warning['text'])}"] += 1
            elif line.strip():
                self.other += 1


def _numbers(text: str) -> str:
    """The text with every number as ``N``, so one kind of line counts as one."""
    return re.sub(r"\d+", "N", text)[:160]


@contextmanager
def captured() -> Iterator[ChildOutput]:
    """Workers started inside write their standard error to files, counted when this ends."""
    global _directory
    output = ChildOutput()
    with tempfile.TemporaryDirectory(prefix="durably-sweep-stderr-") as directory:
        _directory = Path(directory)
        try:
            yield output
        finally:
            _directory = None
            with suppress(OSError):
                output.read(Path(directory))


def worker_started() -> None:
    """In a new worker: interrupts are the caller's to handle, stderr goes to a capture file.

    Ctrl-C signals the whole terminal's process group; the caller stops the
    workers itself (and prints what ran), so they ignore SIGINT. SIGTERM is
    reset to its default: a caller's own SIGTERM handler, inherited by the
    fork, must not run in a worker that its pool terminates.
    """
    global _redirected
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # A progress display in the caller may have swapped in its own streams (Rich's
    # Live redirects them to print above its bar): the fork's copies would draw
    # the caller's bar again with every line. This process writes to its own fds.
    sys.stdout = sys.__stdout__ or sys.stdout
    sys.stderr = sys.__stderr__ or sys.stderr
    # The sweep judges every verdict itself; a scenario's one-line ladder announcements
    # (printed to stderr while nothing else handles them) are not a child's output.
    logging.getLogger("durably.ladder").addHandler(logging.NullHandler())
    if _directory is None or _redirected:
        return
    fd = os.open(
        _directory / f"worker-{os.getpid()}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
    )
    sys.stderr.flush()
    os.dup2(fd, 2)
    os.close(fd)
    _redirected = True


def scenario_logging(*, drop: bool = True) -> None:
    """In a scenario's process: the ``durably`` logger's records to the capture file.

    Outside a capture they are dropped, or with ``drop=False`` left as they are.
    """
    if not (_redirected or drop):
        return
    logger = logging.getLogger("durably")
    if any(h.get_name() == _HANDLER for h in logger.handlers):
        return  # a forked process's parent added it already
    handler: logging.Handler
    if _redirected:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        handler.setLevel(logging.WARNING)
    else:
        handler = logging.NullHandler()
    handler.set_name(_HANDLER)
    logger.addHandler(handler)
