"""What the ``durably`` commands share: argparse types, the ``--state`` option, the epilog."""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..storechoice import StoreChoice

__all__ = [
    "EPILOG",
    "choose_store",
    "dsn_option",
    "duration",
    "non_negative_int",
    "output_file",
    "positive_amount",
    "positive_int",
    "run_id",
    "state_option",
    "store_options",
]

EPILOG = """exit codes: 0 done, 1 failed, 2 bad usage, 3 paused (waiting for a person),
4 locked (another process owns the run), 5 limit reached, 6 finished but checks failed"""


def state_option(command: argparse.ArgumentParser) -> None:
    """Give ``command`` the demo's ``--state DIR`` option (default: .durably)."""
    command.add_argument(
        "--state",
        type=Path,
        default=Path(".durably"),
        help="state directory (default: .durably)",
    )


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is too small: give 1 or more")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number of at least 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is too small: give 0 or more")
    return value


def positive_amount(text: str) -> float:
    """An argparse type: a finite number above 0 (dollars, seconds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text} is not a positive amount: give more than 0")
    return value


def run_id(text: str) -> str:
    """An argparse type: a valid run ID, checked before it is ever used in a path."""
    # Imported here: durably.keys loads hashlib and secrets, which --help never needs.
    from ..errors import InvalidRunId
    from ..keys import validate_run_id

    try:
        return validate_run_id(text)
    except InvalidRunId as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def output_file(text: str) -> Path:
    """An argparse type: a file written at the end, checked at the start.

    A sweep runs for a minute before it writes its report; a path that cannot be
    written is refused before any of that work is done.
    """
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory: name a file in it")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(
            f"the directory {str(path.parent)!r} does not exist: create it first"
        )
    if not os.access(path.parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"the directory {str(path.parent)!r} is not writable")
    return path


def dsn_option(
    command: argparse.ArgumentParser, help: str, *, from_environment: bool, required: bool = False
) -> None:
    """Give ``command`` a ``--dsn`` option that refuses a password on the command line.

    A command line is visible to every user of the machine (``ps``, ``/proc/PID/cmdline``);
    the environment is not (``/proc/PID/environ`` is the owner's). So a DSN given with
    ``--dsn`` may not carry a password: libpq takes it from ``PGPASSWORD``, ``~/.pgpass``
    or a ``PGSERVICE`` entry instead, and ``$DURABLY_DSN`` (read, not checked, where
    ``from_environment``) may hold a whole DSN. ``required``: the command needs a DSN.
    """
    command.add_argument(
        "--dsn",
        action=_DsnWithoutPassword,
        default=os.environ.get("DURABLY_DSN") if from_environment else None,
        required=required,
        help=help,
    )


class _DsnWithoutPassword(argparse.Action):
    """``--dsn``: checked only when given on the command line, never its default."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        dsn = str(values)
        if _has_password(dsn):
            parser.error(
                "--dsn: refusing a password on the command line (any user can read it with ps); "
                "keep the password in PGPASSWORD, ~/.pgpass or a PGSERVICE entry, "
                "or put the whole DSN in the DURABLY_DSN variable"
            )
        setattr(namespace, self.dest, dsn)


def _has_password(dsn: str) -> bool:
    """Whether a connection string (URI or ``key=value`` form) carries a password."""
    # Imported here: psycopg is the Postgres extra's, and costs the other commands' start.
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:  # without the extra the command fails later, naming it
        return "password=" in dsn or bool(re.match(r"^\w+://[^/@]*:[^/@]*@", dsn))
    from psycopg import ProgrammingError

    try:
        return bool(conninfo_to_dict(dsn).get("password"))
    except ProgrammingError:  # malformed: psycopg names the problem when it connects
        return "password" in dsn


def store_options(command: argparse.ArgumentParser) -> None:
    """Give ``command`` the person's ``--state DIR`` (its runs in ``DIR/runs``) and ``--dsn``."""
    command.add_argument(
        "--state",
        type=Path,
        default=None,
        help="the demo's state directory (its runs live in DIR/runs)",
    )
    dsn_option(
        command,
        "PostgreSQL connection string, no password in it (default: $DURABLY_DSN)",
        from_environment=True,
    )


def choose_store(args: argparse.Namespace) -> StoreChoice:
    """The store the arguments name: a directory ``STORE``, else ``--state``, else ``--dsn``.

    With none of them, ``.durably``'s runs.

    Raises:
        ValueError: the named directory does not exist (nothing is created by a
            command that only reads, answers or cleans up).
    """
    if getattr(args, "store", None):
        directory = Path(args.store)
    elif args.state is not None:
        directory = args.state / "runs"
    elif args.dsn:
        return StoreChoice(dsn=args.dsn)
    else:
        directory = Path(".durably") / "runs"
    if not directory.is_dir():
        hint = (
            " (it is the demo's layout: --state DIR reads DIR/runs)"
            if args.state is not None
            else ""
        )
        raise ValueError(
            f"no store at {directory}: the directory does not exist{hint}; give the directory "
            "your FileStore or JournalStore writes to, --state DIR, or --dsn for Postgres"
        )
    return StoreChoice(directory=directory)


_DURATION = re.compile(r"(\d+)([dhms])")
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def duration(text: str) -> timedelta:
    """An argparse type: a length of time, ``30d``, ``12h``, ``90m``, ``45s`` or ``1d12h``."""
    parts = _DURATION.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: write a whole number and a unit, d (days), h (hours), "
            "m (minutes) or s (seconds), e.g. 30d, 12h, 90m, 45s or 1d12h"
        )
    return timedelta(seconds=sum(int(number) * _UNIT_SECONDS[unit] for number, unit in parts))
