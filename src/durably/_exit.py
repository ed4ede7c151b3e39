"""What the command line promises its callers: exit codes, run directories, error lines.

Where a state directory keeps its runs, and how an error is printed. A low
module, so that the demo's command (``durably.triage.cli``) and the library's
(``durably.cli``) share them without one importing the other.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["EXIT", "Exit", "print_error", "runs_dir"]


class Exit(enum.IntEnum):
    """The ``durably`` command's exit codes; the values are a public contract."""

    DONE = 0
    FAILED = 1
    USAGE = 2
    PAUSED = 3
    """Waiting for a person."""
    LOCKED = 4
    """Another process owns the run."""
    LIMIT = 5
    CHECKS = 6
    """The run finished but its checks failed."""


EXIT: Final[Mapping[str, Exit]] = MappingProxyType({code.name.lower(): code for code in Exit})
"""The exit codes by lower-case name (``EXIT["usage"]``), as the commands spell them."""


def runs_dir(state_dir: Path) -> Path:
    """Where the CLI keeps the run checkpoints of a state directory."""
    return state_dir / "runs"


def print_error(errors: Console, problem: object) -> None:
    """Print an error; its text (paths, IDs, what a person or model wrote) is never Rich markup."""
    from rich.markup import escape

    errors.print(f"[red]error:[/red] {escape(str(problem))}", soft_wrap=True, highlight=False)
