"""Starting a command on a pseudo-terminal, as a person's terminal starts it."""

from __future__ import annotations

import os
import pty
import signal
from collections.abc import Mapping

__all__ = ["on_a_terminal"]

_INTERACTIVE = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)


def on_a_terminal(argv: list[str], env: Mapping[str, str]) -> tuple[int, int]:
    """Exec ``argv`` in a session of its own on a new pseudo-terminal: its pid and the terminal.

    The terminal's signals reach the command as they do from a person's shell: the
    child puts SIGINT, SIGQUIT and SIGHUP back to their defaults first. A test run
    started in the background by a shell without job control (``make test &`` in a
    script, some CI runners) has them ignored, every child would inherit that, and
    Ctrl-C typed on the terminal would reach nothing.
    """
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child execs at once
        try:
            for signum in _INTERACTIVE:
                signal.signal(signum, signal.SIG_DFL)
            os.execve(argv[0], argv, dict(env))  # noqa: S606 - argv is the test's own, no shell
        finally:
            os._exit(127)
    return pid, fd
