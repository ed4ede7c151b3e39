"""``durably triage``: run (or resume) the reference triage agent."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ._args import (
    EPILOG,
    non_negative_int,
    positive_amount,
    positive_int,
    run_id,
    state_option,
)

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["add_triage_command"]


def _cmd_triage(args: argparse.Namespace, console: Console, errors: Console) -> int:
    import asyncio

    from ..triage.cli import triage

    return asyncio.run(triage(args, console, errors))


def add_triage_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``durably triage`` on the ``durably`` parser."""
    triage = commands.add_parser(
        "triage", help="run (or resume) the reference triage agent", epilog=EPILOG
    )
    triage.add_argument(
        "--task", default="m1-done-after-delete", help="task name (default: %(default)s)"
    )
    state_option(triage)
    triage.add_argument(
        "--run", type=run_id, help="resume this run ID instead of the task's unfinished run"
    )
    triage.add_argument(
        "--die-after",
        metavar="TOOL",
        help="SIGKILL this process as soon as the first call of TOOL returns (before its "
        "result is saved)",
    )
    triage.add_argument(
        "--approve",
        choices=("on", "off", "later"),
        default="on",
        help="ask on the terminal before filing issues (on), approve everything (off), or "
        "pause for `durably answer` or the console (later)",
    )
    triage.add_argument(
        "--model",
        default=None,
        help="replay, anthropic[:MODEL], openai[:MODEL] or auto; default: for a new run auto "
        "(a provider whose API key is set, else the recording), for a resumed run the model "
        "it started with",
    )
    triage.add_argument(
        "--store",
        choices=("journal", "snapshot"),
        default="journal",
        help="journal (default: one append per save) or snapshot (one JSON file per run)",
    )
    triage.add_argument("--max-turns", type=positive_int, default=40)
    triage.add_argument("--max-dollars", type=positive_amount, default=5.0)
    triage.add_argument(
        "--max-resumes",
        type=non_negative_int,
        default=10,
        help="restarts allowed over the run's life (default: 10); opening a paused run is "
        "not a restart",
    )
    triage.add_argument("--new", action="store_true", help="start a new run even if one is open")
    triage.set_defaults(handler=_cmd_triage)
