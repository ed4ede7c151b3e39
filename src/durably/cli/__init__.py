"""The ``durably`` command: run the triage demo, inspect checkpoints, list runs, sweep.

One module per command group (:mod:`.triage`, :mod:`.runs`, :mod:`.sweep`,
:mod:`.worker`, :mod:`.person`, :mod:`.housekeeping`); this one builds the parser
and maps errors to exit codes.

Exit codes (also in ``durably --help``):

====  =========================================================
0     done (and, for ``triage``, every check passed)
1     failed: an error that names its cause (corrupt checkpoint, changed workspace, ...)
2     bad usage
3     paused: the run waits for a person (resume with the same command)
4     locked: another process owns the run
5     limit reached (turns, tokens, dollars, resumes); resume with a higher limit
6     the run finished but some checks failed
====  =========================================================
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import sys
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any, NoReturn, cast

from .._exit import EXIT as EXIT
from .._exit import Exit as Exit
from .._exit import print_error
from .._exit import runs_dir as runs_dir
from ..errors import (
    ApprovalUnavailable,
    DurablyError,
    LimitExceeded,
    Locked,
    MaxResumes,
    OwnershipError,
)
from ._args import EPILOG

if TYPE_CHECKING:
    # rich and asyncio are imported where a command draws or runs, so `durably --help`
    # loads neither (benchmarks/startup.py).
    from rich.console import Console

__all__ = ["EXIT", "main"]


COMMANDS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("triage", "add_triage_command", ("triage",)),
    ("runs", "add_show_command", ("show",)),
    ("sweep", "add_sweep_command", ("sweep",)),
    ("runs", "add_runs_command", ("runs",)),
    ("worker", "add_worker_commands", ("worker", "submit", "workers")),
    ("person", "add_person_commands", ("pending", "answer", "resume", "console")),
    ("housekeeping", "add_housekeeping_commands", ("cancel", "prune")),
)
"""Where each command's parser comes from: (module of this package, its function, the
commands it adds), in the order ``durably --help`` lists them."""


def _command_in(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names, or None when it names none or asks for the general help.

    The one option before a command, ``--debug``, takes no value, so the first
    word not starting with ``-`` is the command.
    """
    for word in argv:
        if word in ("-h", "--help"):
            return None
        if not word.startswith("-"):
            return word
    return None


def _parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command's parser; with ``argv`` naming a known command, only that command's part.

    A command's module is imported only to parse that command (``durably show``
    loads neither the sweep's nor the person's commands); any other ``argv``
    (``--help``, a misspelt command) gets every command, to list or to suggest.
    """
    command = None if argv is None else _command_in(argv)
    chosen = [part for part in COMMANDS if command in part[2]] or list(COMMANDS)
    parser = argparse.ArgumentParser(
        prog="durably",
        description="Durable LLM agent runs: crash at any instant, resume without repeats.",
        epilog=EPILOG,
        formatter_class=_RawDescriptionFormatter,
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_CommandParser
    )
    for module, adder, _ in chosen:
        getattr(importlib.import_module(f".{module}", __package__), adder)(commands)
    return parser


def _columns() -> int:
    """``shutil.get_terminal_size().columns``, without importing shutil.

    argparse makes a formatter for every option it is given (to check its
    metavar), and the formatter asks shutil for the width: shutil loads the
    compression modules (bz2, lzma) that no command's parsing needs.
    """
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter, as wide as the terminal (:func:`_columns`)."""

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ) -> None:
        width = _columns() - 2 if width is None else width  # as argparse narrows it
        super().__init__(prog, indent_increment, max_help_position, width)


class _RawDescriptionFormatter(_Formatter, argparse.RawDescriptionHelpFormatter):
    """The top-level help: the epilog's lines kept as written."""


class _CommandParser(argparse.ArgumentParser):
    """A command's parser: options anywhere among its positionals, errors under its own usage.

    argparse matches a command's positionals in one stretch, so in ``durably answer
    RUN CALL no --reason TEXT STORE`` the STORE after the option was "unrecognized" (a
    refusal meant for a refund was lost that way). Each command is parsed as
    :meth:`parse_intermixed_args` does, and a word it does not know is its own error,
    shown with its own usage, not the top-level parser's.
    """

    _inner = False

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(**kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._inner:  # parse_known_intermixed_args calls back here, in two passes
            return super().parse_known_args(args, namespace)
        self._inner = True
        try:
            parsed, extras = self.parse_known_intermixed_args(args, namespace)
        finally:
            self._inner = False
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def _exit_code(exc: DurablyError) -> int:
    if isinstance(exc, ApprovalUnavailable):
        return EXIT["paused"]  # the run is saved as paused, waiting for a person
    if isinstance(exc, Locked | OwnershipError):
        return EXIT["locked"]
    if isinstance(exc, LimitExceeded | MaxResumes):
        return EXIT["limit"]
    return EXIT["failed"]


_PIPE_WIDTH = 160


def _console(*, stderr: bool = False) -> Console:
    """A console for output; to a pipe or a file it is 160 columns wide unless COLUMNS says.

    Rich gives a console that is not a terminal 80 columns, which cuts the
    sweep's table and run IDs short in a log or a CI transcript.
    """
    from rich.console import Console

    console = Console(stderr=stderr, soft_wrap=True)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(stderr=stderr, soft_wrap=True, width=_PIPE_WIDTH)
    return console


_DISK_REFUSALS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})
"""Errors that a person mends by freeing space or changing permissions."""


class _Output:
    """A command's output: a rich Console, made the first time something is drawn with it.

    For commands registered with ``plain_output=True``: ``durably runs`` writes
    its table as text to :attr:`file`, so it never pays for loading rich (a
    fifth of its start-up). :attr:`is_terminal` follows
    rich's own rules (``TTY_COMPATIBLE``, then ``FORCE_COLOR``, then whether the
    stream is a terminal) without loading it.
    """

    def __init__(self, *, stderr: bool = False) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    @property
    def file(self) -> IO[str]:
        """The stream written to."""
        if self._console is not None:
            return self._console.file
        return sys.stderr if self._stderr else sys.stdout

    @property
    def is_terminal(self) -> bool:
        """Whether escape sequences (colour) may be written to :attr:`file`."""
        if self._console is not None:
            return self._console.is_terminal
        compatible = os.environ.get("TTY_COMPATIBLE", "")
        if compatible in ("0", "1"):
            return compatible == "1"
        force = os.environ.get("FORCE_COLOR")
        if force is not None:
            return force != ""
        try:
            return self.file.isatty()
        except ValueError:  # a closed stream
            return False

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            self._console = _console(stderr=self._stderr)
        return getattr(self._console, name)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of the ``durably`` command."""
    args = _parser(sys.argv[1:] if argv is None else argv).parse_args(argv)
    if getattr(args, "plain_output", False):
        # A command that writes text: consoles made only if it draws (an error).
        console, errors = cast("Console", _Output()), cast("Console", _Output(stderr=True))
    else:
        console, errors = _console(), _console(stderr=True)
    try:
        code = args.handler(args, console, errors)
    except DurablyError as exc:
        if args.debug:
            raise
        print_error(errors, exc)
        code = _exit_code(exc)
    except BrokenPipeError:
        # The reader went away (`| head`): nothing to say, and nobody to say it to.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EXIT["failed"]
    except OSError as exc:
        if args.debug:
            raise
        # What the disk or the system refused, without a traceback; saved state stays.
        hint = (
            "free disk space or fix permissions, then run the command again"
            if exc.errno in _DISK_REFUSALS
            else "run the command again once that is mended"
        )
        print_error(errors, f"{exc}; {hint} (what was saved is kept)")
        code = EXIT["failed"]
    except KeyboardInterrupt:
        errors.print("interrupted; the run is saved where it stopped: run the command again")
        # Every save has landed and the run's store is closed by now. Tearing the
        # interpreter down (a provider SDK's modules) takes about a second, which a
        # person who pressed Ctrl-C should not wait for: flush and leave.
        import logging

        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(130)
    sys.exit(code)
