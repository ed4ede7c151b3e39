"""``durably cancel`` and ``durably prune``: stop a run, and remove finished runs.

Both work on any store that offers :class:`~durably.stores.Housekeeping` (the
file stores and Postgres), named as the person's commands name one: a directory,
``--state DIR`` (its runs in ``DIR/runs``) or ``--dsn``. The work is the store's
own :meth:`~durably.stores.Housekeeping.cancel` and
:meth:`~durably.stores.Housekeeping.prune`, the same calls the API offers.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from .._exit import EXIT, print_error
from ..storechoice import StoreChoice, opened_store
from ._args import choose_store, duration, run_id, store_options

if TYPE_CHECKING:
    from rich.console import Console

    from ..listing import RunSummary
    from ..stores import CancelOutcome, Housekeeping, PruneReport, Store

__all__ = ["add_housekeeping_commands"]


class _NoHousekeeping(Exception):
    """The store offers no ``Housekeeping`` (a store of the user's own, or not built yet)."""


def _keeper(store: Store, choice: StoreChoice) -> Housekeeping:
    """``store`` as :class:`~durably.stores.Housekeeping`, or an error that says it is not."""
    from ..stores import Housekeeping

    if not isinstance(store, Housekeeping):
        raise _NoHousekeeping(
            f"the store at {choice.describe()} ({type(store).__name__}) cannot cancel or prune "
            "runs: it does not offer durably.stores.Housekeeping (cancel and prune)"
        )
    return store


# -- durably cancel ----------------------------------------------------------------------


async def _cancel(choice: StoreChoice, run: str) -> tuple[CancelOutcome, str | None]:
    """Cancel ``run``; what happened, and for a run already finished, its phase."""
    from ..stores import CancelOutcome

    async with opened_store(choice) as store:
        outcome = await _keeper(store, choice).cancel(run)
        if outcome is not CancelOutcome.FINISHED:
            return outcome, None
        return outcome, str((await store.read(run)).phase)  # done or cancelled: say which


def _cmd_cancel(args: argparse.Namespace, console: Console, errors: Console) -> int:
    import asyncio

    from ..stores import CancelOutcome

    try:
        choice = choose_store(args)
    except ValueError as exc:
        print_error(errors, exc)
        return EXIT["usage"]
    try:
        outcome, phase = asyncio.run(_cancel(choice, args.run))
    except _NoHousekeeping as exc:
        print_error(errors, exc)
        return EXIT["failed"]
    run = args.run
    if outcome is CancelOutcome.CANCELLED:
        line = f"cancelled {run}: nobody held it; it is saved as cancelled and never runs again"
    elif outcome is CancelOutcome.REQUESTED:
        line = (
            f"asked the owner of {run} to stop: it ends the run as cancelled after its "
            "current save (a call already under way finishes first); `durably show` tells"
        )
    else:
        line = f"{run} was already finished ({phase}); nothing changed"
    console.print(line, highlight=False, markup=False)
    return EXIT["done"]


# -- durably prune -----------------------------------------------------------------------


async def _prune(choice: StoreChoice, older_than: timedelta) -> PruneReport:
    async with opened_store(choice) as store:
        return await _keeper(store, choice).prune(older_than=older_than)


async def _would_prune(
    choice: StoreChoice, older_than: timedelta
) -> tuple[list[RunSummary], list[RunSummary]]:
    """What a prune would take now, from the runs' summaries: (free, held by a process)."""
    from ..listing import list_runs
    from ..state import utcnow

    cutoff = utcnow() - older_than
    async with opened_store(choice) as store:
        _keeper(store, choice)  # a dry run of a prune the store could not make says so too
        listed = await list_runs(store)
    chosen = [
        s
        for s in listed.summaries
        if s.phase in ("done", "cancelled") and s.saved_at is not None and s.saved_at < cutoff
    ]
    return [s for s in chosen if not s.claimed], [s for s in chosen if s.claimed]


def _cmd_prune(args: argparse.Namespace, console: Console, errors: Console) -> int:
    import asyncio

    from ..state import utcnow

    try:
        choice = choose_store(args)
    except ValueError as exc:
        print_error(errors, exc)
        return EXIT["usage"]
    cutoff = _when(utcnow() - args.older_than)
    where = choice.describe()
    out = console.file
    try:
        if args.dry_run:
            free, held = asyncio.run(_would_prune(choice, args.older_than))
            out.write(
                f"would prune {len(free)} finished run(s) last saved before {cutoff} "
                f"in {where} (dry run: nothing removed)\n"
            )
            out.writelines(f"  {s.run_id}  {s.phase}, saved {_when(s.saved_at)}\n" for s in free)
            out.writelines(f"  {s.run_id}  left: a process holds it\n" for s in held)
            return EXIT["done"]
        report = asyncio.run(_prune(choice, args.older_than))
    except _NoHousekeeping as exc:
        print_error(errors, exc)
        return EXIT["failed"]
    out.write(
        f"pruned {len(report.pruned)} finished run(s) last saved before {cutoff} from {where}\n"
    )
    out.writelines(f"  {run}  pruned\n" for run in report.pruned)
    out.writelines(
        f"  {run}  left: a process holds it (the next prune takes it)\n" for run in report.owned
    )
    out.flush()
    return EXIT["done"]


def _when(moment: datetime | None) -> str:
    return "-" if moment is None else moment.isoformat(timespec="seconds")


_STORE_HELP = "the directory your FileStore/JournalStore writes to (default: .durably/runs)"


def add_housekeeping_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """Register ``durably cancel`` and ``durably prune`` on the ``durably`` parser."""
    cancel = commands.add_parser(
        "cancel",
        help="stop a run: at once if nobody holds it, else after its owner's current save",
    )
    cancel.add_argument("run", type=run_id, help="run ID")
    cancel.add_argument("store", nargs="?", metavar="STORE", help=_STORE_HELP)
    store_options(cancel)
    cancel.set_defaults(handler=_cmd_cancel)

    prune = commands.add_parser(
        "prune",
        help="delete finished runs (done or cancelled) last saved longer ago than --older-than",
    )
    prune.add_argument("store", nargs="?", metavar="STORE", help=_STORE_HELP)
    prune.add_argument(
        "--done",
        action="store_true",
        required=True,
        help="prune finished runs: done or cancelled (required: a prune says what it removes; "
        "a run that is not finished, or that a process holds, is never touched)",
    )
    prune.add_argument(
        "--older-than",
        type=duration,
        required=True,
        metavar="AGE",
        help="only runs last saved longer ago than this: 30d, 12h, 90m, 45s, 1d12h",
    )
    prune.add_argument(
        "--dry-run", action="store_true", help="say what would be pruned, remove nothing"
    )
    store_options(prune)
    prune.set_defaults(handler=_cmd_prune, plain_output=True)
