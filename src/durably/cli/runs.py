"""``durably show`` and ``durably runs``: one run's checkpoint, and a table of runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .._exit import EXIT, print_error, runs_dir
from ._args import dsn_option, positive_int, state_option
from ._args import run_id as run_id_arg

if TYPE_CHECKING:
    # The store, the state's codec and rich load when a command runs, so that
    # `durably --help` (and every other command) does not pay for them.
    from rich.console import Console

    from ..listing import Listing
    from ..postgres.fleet import QueuedRun
    from ..state import RunState
    from ..stores.file import FileStore

PHASES = ("model", "tools", "paused", "done", "cancelled")
"""The values of ``durably.state.Phase``, written out so that building the parser
(``durably --help``) does not import the state's codec; a test keeps them equal."""

FLEET_PHASES = ("queued", "claimed", "parked")
"""What ``--phase`` also picks: submitted runs no worker started (Postgres), runs a
live lease holds, and runs a worker parked for a person (in any phase)."""

__all__ = [
    "FLEET_PHASES",
    "PHASES",
    "add_runs_command",
    "add_show_command",
    "pick_run",
    "run_by_prefix",
    "runs_table",
    "show",
]


def show(state: RunState, console: Console) -> None:
    """Print one run's checkpoint for a person, as text (rich is not loaded to draw it).

    User and model text is printed as written: never read as markup or emoji, its
    control characters escaped (:func:`durably.listing.plain`).
    """
    console.file.write(show_text(state, color=console.is_terminal))
    console.file.flush()


def show_text(state: RunState, *, color: bool = False) -> str:
    """:func:`show`'s text; ``color``: ANSI bold and yellow, for a terminal."""
    from ..listing import plain, table
    from ..state import age

    def styled(text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if color else text

    rows = [
        ("task", state.task.splitlines()[0][:100] if state.task else "-"),
        ("phase", styled(str(state.phase), "1")),
        ("turns", str(state.turns)),
        (
            "usage",
            f"{state.usage.input_tokens} in / {state.usage.output_tokens} out, "
            f"${state.dollars:.4f}",
        ),
    ]
    if state.unsaved_replies:
        rows.append(
            (
                "lost replies",
                f"{state.unsaved_replies}, counted at their worst case: "
                f"${state.unsaved_dollars:.4f}",
            )
        )
    in_flight = state.model_call
    if in_flight is not None:
        rows.append(
            (
                "model call",
                f"turn {in_flight.turn} asked {age(in_flight.asked_at)}, "
                f"up to ${in_flight.worst_dollars:.4f}",
            )
        )
    rows += [
        ("restarts", str(state.resumes)),
        ("created", state.created_at.isoformat(timespec="seconds")),
        ("last saved", age(state.saved_at)),
    ]
    if state.answer is not None:
        rows.append(("answer", state.answer[:300]))
    if state.stop_reason:
        rows.append(("stopped", state.stop_reason))
    key_width = max(len(key) for key, _ in rows)
    out = [styled(state.run_id, "1")]
    for key, value in rows:
        # The value's own lines stay under its column; the phase's ANSI is ours, kept.
        lines = (plain(value) if key != "phase" else value).split("\n")
        out.append(f"{styled(key.ljust(key_width), '2')}  {lines[0]}".rstrip())
        out += [f"{' ' * key_width}  {more}".rstrip() for more in lines[1:]]
    text = "\n".join(out) + "\n"

    if state.pending:
        text += table(
            ("call", "tool", "question", "asked"),
            [
                (
                    approval.call_id,
                    approval.tool,
                    "approve?" if approval.kind == "approve" else f"did it happen? {approval.why}",
                    age(approval.asked_at),
                )
                for approval in state.pending.values()
            ],
            title="waiting for a person",
        )

    if state.markers:
        text += table(
            ("call", "tool", "idempotency key", "age", "intended files"),
            [
                (
                    call_id,
                    marker.tool,
                    marker.key,
                    age(marker.started_at),
                    ", ".join(f"{p} ({h[:12]})" for p, h in marker.intended.items()) or "-",
                )
                for call_id, marker in state.markers.items()
            ],
            title="attempt markers (calls that may have acted)",
        )

    text += _decisions_text(state)

    reply = state.last_reply()
    if reply is not None and reply.calls:
        answered = state.answered()
        calls = []
        for call in reply.calls:
            result = answered.get(call.id)
            status = "-" if result is None else ("error" if result.is_error else "yes")
            if call.id in state.markers:
                status = "in doubt"
            calls.append((call.id, call.name, call.arguments[:60], status))
        text += table(
            ("call", "tool", "arguments", "answered"),
            calls,
            title=f"last reply (turn {reply.turn})",
        )
    return text


def _decisions_text(state: RunState) -> str:
    """The run's ladder verdicts and approval answers, kept for its whole life (done runs too)."""
    from ..listing import table
    from ..state import LADDER_STEPS, AssistantMessage

    tools = {
        call.id: call.name
        for message in state.messages
        if isinstance(message, AssistantMessage)
        for call in message.calls
    }
    text = ""
    if state.resolutions:
        text += table(
            ("call", "tool", "ladder step", "outcome", "by", "detail"),
            [
                (
                    call_id,
                    tools.get(call_id, "?"),
                    f"{resolution.step} ({LADDER_STEPS.get(resolution.step, '?')})",
                    str(resolution.outcome),
                    resolution.by or "-",
                    (resolution.detail or "-")[:100],
                )
                for call_id, resolution in state.resolutions.items()
            ],
            title="resolutions (calls found in doubt)",
        )
    if state.approvals_given:
        rows = []
        for call_id, decision in state.approvals_given.items():
            when = decision.decided_at
            rows.append(
                (
                    call_id,
                    tools.get(call_id, "?"),
                    "yes" if decision.approved else "no",
                    decision.by or "-",
                    when.isoformat(timespec="seconds") if when is not None else "-",
                    (decision.reason or "-")[:100],
                )
            )
        text += table(("call", "tool", "answer", "by", "when", "reason"), rows, title="approvals")
    return text


def runs_table(
    store: FileStore,
    console: Console,
    errors: Console,
    *,
    phase: str | None = None,
    limit: int | None = None,
    sort: str = "saved",
) -> int:
    """Print a table of a store's runs from their summaries; return how many could not be read.

    The summaries come through the listing index (``durably.listing``): only runs
    changed since the last listing are loaded. Unreadable runs are named on
    ``errors`` and shown last (unless ``phase`` picks one phase), whatever the limit.
    """
    from ..listing import list_directory

    listed = list_directory(store)
    title = f"runs in {store.directory}"
    return _print_listing(listed, console, errors, title=title, phase=phase, limit=limit, sort=sort)


def _print_listing(
    listed: Listing,
    console: Console,
    errors: Console,
    *,
    title: str,
    phase: str | None,
    limit: int | None,
    sort: str,
    fleet: bool = False,
) -> int:
    from ..listing import render, render_fleet, select

    for _, exc in listed.unreadable:
        print_error(errors, exc)
    shown = select(listed.summaries, phase=phase, sort=sort, limit=limit)
    broken = [run for run, _ in listed.unreadable] if phase is None else []
    # Written as text: rich takes seconds to lay out thousands of rows (listing.render).
    draw = render_fleet if fleet else render
    console.file.write(draw(shown, broken, title=title, color=console.is_terminal))
    console.file.flush()
    return len(listed.unreadable)


async def _list_postgres(dsn: str) -> tuple[Listing, str]:
    """Every run of the Postgres store at ``dsn``, and where it is.

    Queued ones too, from the summary columns (``durably.postgres.fleet``).
    """
    from ..postgres.store import PostgresStore

    async with PostgresStore(dsn) as store:
        return await store.summaries(), store.where


def run_by_prefix(store: FileStore, given: str) -> str | list[str]:
    """The run ``given`` names, as git names commits: a whole ID, or the start of only one.

    Returns the run ID, or every run ID ``given`` starts when there is more than
    one. A prefix of none is returned as given, so reading it fails naming it.
    """
    return pick_run(store.list_runs_sync(), given)


def pick_run(runs: list[str], given: str) -> str | list[str]:
    """:func:`run_by_prefix` over the run IDs ``runs``."""
    if given in runs:
        return given
    matches = [run for run in runs if run.startswith(given)]
    if len(matches) > 1:
        return matches
    return matches[0] if matches else given


def _store_directory(args: argparse.Namespace, errors: Console) -> Path | None:
    """The directory ``STORE`` (or ``--state DIR``'s ``DIR/runs``) names; None, said, if missing.

    A directory given by itself is the one a FileStore/JournalStore was given.
    Nothing is created: an empty table, or "no run", would hide a mistyped path.
    """
    directory = Path(args.store) if args.store else runs_dir(args.state)
    if directory.is_dir():
        return directory
    given = "" if args.store else f"nothing has run with --state {args.state}; "
    errors.print(f"no runs: {directory} does not exist ({given}check the path)", highlight=False)
    return None


def _cmd_show(args: argparse.Namespace, console: Console, errors: Console) -> int:
    found: RunState | list[str] | str
    if args.dsn:
        import asyncio

        found = asyncio.run(_read_postgres(args.dsn, args.run))
    else:
        directory = _store_directory(args, errors)
        if directory is None:
            return EXIT["usage"]  # as `runs` and `pending` answer a missing store
        from ..stores.journal import JournalStore

        store = JournalStore(directory)  # reads snapshot-store runs too
        run = run_by_prefix(store, args.run)
        found = run if isinstance(run, list) else store.read_sync(run)
    if isinstance(found, list):
        errors.print(
            f"error: {args.run!r} starts {len(found)} run IDs: {', '.join(found)}; "
            "give more of the ID",
            soft_wrap=True,
            highlight=False,
        )
        return EXIT["usage"]
    if isinstance(found, str):  # a queued run: no state to show yet
        sys.stdout.write(found)
        return EXIT["done"]
    state = found
    if args.json:
        import msgspec

        from ..state import encode_state

        sys.stdout.write(msgspec.json.format(encode_state(state), indent=2).decode() + "\n")
    else:
        show(state, console)
    return EXIT["done"]


async def _read_postgres(dsn: str, given: str) -> RunState | list[str] | str:
    """The run ``given`` names in the Postgres store at ``dsn``, or the IDs it starts.

    For a queued run: the text that says so, and whether a live worker serves it.
    """
    from ..postgres.fleet import queued_run
    from ..postgres.store import PostgresStore

    async with PostgresStore(dsn) as store:
        listed = await store.summaries()
        run = pick_run([s.run_id for s in listed.summaries], given)
        if isinstance(run, list):
            return run
        queued = await queued_run(store, run)
        if queued is None:
            return await store.read(run)
        return queued_text(queued, store.where)


def queued_text(queued: QueuedRun, where: str) -> str:
    """What ``durably show`` says of a queued run: its agent, task, age, and who serves it."""
    from ..listing import plain
    from ..state import age

    if queued.workers:
        names = ", ".join(w.owner for w in queued.workers)
        serving = f"{len(queued.workers)} live worker(s) serve {queued.agent!r}: {names}"
    else:
        serving = (
            f"none: no live worker serves agent {queued.agent!r}; start one with "
            f"`durably worker --dsn ... --import MODULE` (MODULE registers {queued.agent!r})"
        )
    rows = [
        ("phase", "queued: submitted, not yet started by a worker"),
        ("agent", queued.agent),
        ("task", queued.task.splitlines()[0][:100] if queued.task else "-"),
        (
            "submitted",
            f"{queued.created_at.isoformat(timespec='seconds')} ({age(queued.created_at)})",
        ),
        ("workers", serving),
        ("store", where),
    ]
    if queued.parked:
        rows.insert(1, ("parked", queued.parked))
    width = max(len(key) for key, _ in rows)
    lines = [plain(queued.run_id)] + [f"{key.ljust(width)}  {plain(value)}" for key, value in rows]
    return "\n".join(lines) + "\n"


def _cmd_runs(args: argparse.Namespace, console: Console, errors: Console) -> int:
    if args.dsn:
        import asyncio

        listed, where = asyncio.run(_list_postgres(args.dsn))
        unreadable = _print_listing(
            listed,
            console,
            errors,
            title=f"runs in {where}",
            phase=args.phase,
            limit=args.limit,
            sort=args.sort,
            fleet=True,
        )
        return EXIT["failed"] if unreadable else EXIT["done"]
    directory = _store_directory(args, errors)
    if directory is None:
        return EXIT["usage"]  # as every command that reads a store answers a missing one
    from ..stores.journal import JournalStore

    unreadable = runs_table(
        JournalStore(directory), console, errors, phase=args.phase, limit=args.limit, sort=args.sort
    )
    return EXIT["failed"] if unreadable else EXIT["done"]


_STORE_HELP = "a FileStore/JournalStore directory (instead of --state DIR, which reads DIR/runs)"


def add_show_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``durably show`` on the ``durably`` parser."""
    show_cmd = commands.add_parser("show", help="show one run's checkpoint")
    show_cmd.add_argument(
        "run", type=run_id_arg, help="run ID, or its start if no other run ID starts so"
    )
    show_cmd.add_argument("store", nargs="?", metavar="STORE", help=_STORE_HELP)
    state_option(show_cmd)
    dsn_option(
        show_cmd,
        "read the run from this PostgreSQL store instead of --state (no password in it: "
        "use PGPASSWORD or ~/.pgpass)",
        from_environment=False,
    )
    show_cmd.add_argument("--json", action="store_true", help="print the state as JSON")
    show_cmd.set_defaults(handler=_cmd_show, plain_output=True)  # rich only for an error


def add_runs_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``durably runs`` on the ``durably`` parser."""
    runs_cmd = commands.add_parser("runs", help="list runs")
    runs_cmd.add_argument("store", nargs="?", metavar="STORE", help=_STORE_HELP)
    state_option(runs_cmd)
    dsn_option(
        runs_cmd,
        "list the runs of this PostgreSQL store instead, queued ones too, with their agent, "
        "owner and lease (no password in it: use PGPASSWORD or ~/.pgpass)",
        from_environment=False,
    )
    runs_cmd.add_argument(
        "--phase",
        choices=PHASES + FLEET_PHASES,
        help="only runs in this phase; queued: submitted, not started; claimed: a live lease "
        "holds it; parked: a worker parked it for a person (unreadable runs are still named "
        "on stderr)",
    )
    runs_cmd.add_argument(
        "--limit", type=positive_int, metavar="N", help="at most N runs (after sorting)"
    )
    runs_cmd.add_argument(
        "--sort",
        choices=["saved", "run"],
        default="saved",
        help="saved: last saved first (default); run: by run ID",
    )
    runs_cmd.set_defaults(handler=_cmd_runs, plain_output=True)  # rich only for an error
