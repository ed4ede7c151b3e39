"""The ``durably`` command: run the triage demo, inspect checkpoints, list runs, sweep.

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
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import msgspec

from ._exit import EXIT as EXIT
from ._exit import Exit as Exit
from ._exit import runs_dir as runs_dir
from .errors import (
    ApprovalUnavailable,
    DurablyError,
    InvalidRunId,
    LimitExceeded,
    Locked,
    MaxResumes,
    OwnershipError,
)
from .keys import validate_run_id
from .state import RunState, age, encode_state
from .stores.file import FileStore
from .stores.journal import JournalStore

if TYPE_CHECKING:
    # rich and asyncio are imported where a command draws or runs, so `durably --help`
    # loads neither (benchmarks/startup.py).
    from rich.console import Console

__all__ = ["EXIT", "main"]


_EPILOG = """exit codes: 0 done, 1 failed, 2 bad usage, 3 paused (waiting for a person),
4 locked (another process owns the run), 5 limit reached, 6 finished but checks failed"""


def show(state: RunState, console: Console) -> None:
    """Print one run's checkpoint for a person."""
    from rich.table import Table

    console.print(f"[bold]{state.run_id}[/bold]")
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="dim")
    table.add_column()
    table.add_row("task", state.task.splitlines()[0][:100] if state.task else "-")
    table.add_row("phase", f"[bold]{state.phase}[/bold]")
    table.add_row("turns", str(state.turns))
    table.add_row(
        "usage",
        f"{state.usage.input_tokens} in / {state.usage.output_tokens} out, ${state.dollars:.4f}",
    )
    if state.unsaved_replies:
        table.add_row(
            "lost replies",
            f"{state.unsaved_replies}, counted at their worst case: ${state.unsaved_dollars:.4f}",
        )
    in_flight = state.model_call
    if in_flight is not None:
        table.add_row(
            "model call",
            f"turn {in_flight.turn} asked {age(in_flight.asked_at)}, "
            f"up to ${in_flight.worst_dollars:.4f}",
        )
    table.add_row("restarts", str(state.resumes))
    table.add_row("created", state.created_at.isoformat(timespec="seconds"))
    table.add_row("last saved", age(state.saved_at))
    if state.answer is not None:
        table.add_row("answer", state.answer[:300])
    if state.stop_reason:
        table.add_row("stopped", state.stop_reason)
    console.print(table)

    if state.pending:
        pending = Table(title="waiting for a person", title_justify="left")
        for column in ("call", "tool", "question", "asked"):
            pending.add_column(column)
        for approval in state.pending.values():
            question = (
                "approve?" if approval.kind == "approve" else f"did it happen? {approval.why}"
            )
            pending.add_row(approval.call_id, approval.tool, question, age(approval.asked_at))
        console.print(pending)

    if state.markers:
        markers = Table(title="attempt markers (calls that may have acted)", title_justify="left")
        for column in ("call", "tool", "idempotency key", "age", "intended files"):
            markers.add_column(column)
        for call_id, marker in state.markers.items():
            files = ", ".join(f"{p} ({h[:12]})" for p, h in marker.intended.items()) or "-"
            markers.add_row(call_id, marker.tool, marker.key, age(marker.started_at), files)
        console.print(markers)

    reply = state.last_reply()
    if reply is not None and reply.calls:
        answered = state.answered()
        calls = Table(title=f"last reply (turn {reply.turn})", title_justify="left")
        for column in ("call", "tool", "arguments", "answered"):
            calls.add_column(column)
        for call in reply.calls:
            result = answered.get(call.id)
            status = "-" if result is None else ("error" if result.is_error else "yes")
            if call.id in state.markers:
                status = "[yellow]in doubt[/yellow]"
            calls.add_row(call.id, call.name, call.arguments[:60], status)
        console.print(calls)


def runs_table(store: FileStore, console: Console, errors: Console) -> int:
    """Print a table of every run in a store; return how many could not be read."""
    from rich.table import Table

    table = Table(title=f"runs in {store.directory}", title_justify="left")
    for column in ("run", "phase", "turns", "dollars", "restarts", "last saved"):
        table.add_column(
            column,
            justify="right" if column in ("turns", "dollars") else "left",
            overflow="fold" if column == "run" else "ellipsis",  # a run ID is never cut short
        )
    unreadable = 0
    for run_id in store.list_runs_sync():
        try:
            state = store.read_sync(run_id)
        except DurablyError as exc:
            unreadable += 1
            table.add_row(run_id, "[red]unreadable[/red]", "-", "-", "-", "-")
            errors.print(f"[red]error:[/red] {exc}", soft_wrap=True, highlight=False)
            continue
        table.add_row(
            run_id,
            str(state.phase),
            str(state.turns),
            f"${state.dollars:.4f}",
            str(state.resumes),
            age(state.saved_at),
        )
    console.print(table)
    return unreadable


def run_by_prefix(store: FileStore, given: str) -> str | list[str]:
    """The run ``given`` names, as git names commits: a whole ID, or the start of only one.

    Returns the run ID, or every run ID ``given`` starts when there is more than
    one. A prefix of none is returned as given, so reading it fails naming it.
    """
    runs = store.list_runs_sync()
    if given in runs:
        return given
    matches = [run for run in runs if run.startswith(given)]
    if len(matches) > 1:
        return matches
    return matches[0] if matches else given


def _cmd_show(args: argparse.Namespace, console: Console, errors: Console) -> int:
    store = JournalStore(runs_dir(args.state))  # reads snapshot-store runs too
    run = run_by_prefix(store, args.run)
    if isinstance(run, list):
        errors.print(
            f"error: {args.run!r} starts {len(run)} run IDs: {', '.join(run)}; give more of the ID",
            soft_wrap=True,
            highlight=False,
        )
        return EXIT["usage"]
    state = store.read_sync(run)
    if args.json:
        sys.stdout.write(msgspec.json.format(encode_state(state), indent=2).decode() + "\n")
    else:
        show(state, console)
    return EXIT["done"]


def _cmd_runs(args: argparse.Namespace, console: Console, errors: Console) -> int:
    # A directory given by itself is the one a FileStore/JournalStore was given.
    directory = Path(args.store) if args.store else runs_dir(args.state)
    if not directory.is_dir():
        # An empty table would hide a mistyped --state; nothing is created here.
        errors.print(
            f"no runs: {directory} does not exist (nothing has run with --state {args.state}; "
            "check the path)",
            highlight=False,
        )
        return EXIT["done"]
    unreadable = runs_table(JournalStore(directory), console, errors)
    return EXIT["failed"] if unreadable else EXIT["done"]


def _cmd_triage(args: argparse.Namespace, console: Console, errors: Console) -> int:
    import asyncio

    from .triage.cli import triage

    return asyncio.run(triage(args, console, errors))


def _power_loss(task: str, jobs: int, console: Console, errors: Console) -> int:
    """Every power cut at every operation of both stores' saves: how many disks, how many wrong."""
    import functools

    from rich.table import Table

    from .stores.journal import JournalStore
    from .sweep.powerloss import MUTANTS, check_lock_exclusion, explore

    stores: dict[str, Callable[..., FileStore]] = {
        "snapshot": FileStore,
        "journal": JournalStore,
        "journal, compacting": functools.partial(
            JournalStore, compact_min_bytes=0, compact_ratio=0.5
        ),
    }
    table = Table(title="power-loss model: every legal disk after every operation")
    for header in ("store", "mode", "points", "disk states", "images loaded", "violations"):
        table.add_column(header, justify="left" if header in ("store", "mode") else "right")
    violations = 0
    for name, store in stores.items():
        for resume in (False, True):
            found = explore(saves=4, store=store, resume=resume)
            violations += len(found.violations)
            table.add_row(
                name,
                "open (restart)" if resume else "read",
                str(found.points),
                str(found.states),
                str(found.images),
                str(len(found.violations)),
                style="red" if found.violations else "",
            )
            for violation in found.violations[:3]:
                errors.print(f"[red]violation:[/red] {name}: {violation}")
    lock = check_lock_exclusion()
    violations += len(lock)
    console.print(table)
    caught = sum(1 for mutant in MUTANTS if _mutant_caught(mutant))
    console.print(
        f"lock exclusion: {len(lock)} violations; seeded mutants caught: {caught}/{len(MUTANTS)}"
    )
    problems = _power_loss_runs(task, jobs, console, errors)
    failed = violations or caught != len(MUTANTS) or problems
    return EXIT["failed"] if failed else EXIT["done"]


def _power_loss_runs(task: str, jobs: int, console: Console, errors: Console) -> int:
    """The triage run resumed on every disk a power cut can leave, for each store."""
    from .sweep import CONFIGS
    from .sweep.powerloss_sweep import run_power_loss_sweep
    from .triage.job import TriageJob

    problems = 0
    for store in ("journal", "snapshot"):
        report = run_power_loss_sweep(TriageJob(task), config=CONFIGS[0], store=store, jobs=jobs)
        console.print(report.text().rstrip())
        for problem in report.problems()[:3]:
            errors.print(f"[red]problem:[/red] {problem}")
        problems += len(report.problems())
    return problems


def _mutant_caught(mutant: str) -> bool:
    from .sweep.powerloss import MUTANTS, check_lock_exclusion, check_protocol, check_workspace

    if MUTANTS[mutant].caught_by == "check_workspace":
        return bool(check_workspace(mutant=mutant))
    return bool(check_protocol(saves=3, mutant=mutant) or check_lock_exclusion(mutant=mutant))


def _unsynced_journal(directory: Path) -> FileStore:
    from .stores.journal import JournalStore

    return JournalStore(directory, sync=False)


_SWEEP_STORES: dict[str, Callable[[Path], FileStore] | None] = {
    "snapshot": None,  # the job's own: an unsynced FileStore
    "journal": _unsynced_journal,
}
"""What ``durably sweep --store`` runs each scenario on (without syncs: it kills processes)."""


def _cmd_sweep(args: argparse.Namespace, console: Console, errors: Console) -> int:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.table import Table

    from .sweep import CONFIGS, run_sweep
    from .triage.job import TriageJob
    from .triage.world import TASKS

    if args.task not in TASKS:
        errors.print(f"error: unknown task {args.task!r}; tasks: {', '.join(TASKS)}")
        return EXIT["usage"]
    known = {c.name: c for c in CONFIGS}
    unknown = [name for name in args.config or () if name not in known]
    if unknown:
        errors.print(
            f"error: unknown configuration {unknown[0]!r}; configurations: {', '.join(known)}"
        )
        return EXIT["usage"]
    if args.power_loss:
        return _power_loss(args.task, args.jobs, console, errors)
    if args.syscalls:
        return _syscall_sweep(args, console, errors)
    if args.random is not None:
        return _random_sweep(args, console, errors)
    chosen = [known[name] for name in args.config] if args.config else list(CONFIGS)
    columns = (
        TextColumn("[bold]sweep[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:.1f} scenarios/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    # Refreshed from this thread only: the sweep forks, and a refresh thread could
    # hold the console's lock at that instant.
    with Progress(*columns, console=errors, auto_refresh=False, transient=True) as bar:
        task_id = bar.add_task("sweep", total=None, rate=0.0)

        def progress(done: int, total: int) -> None:
            elapsed = bar.tasks[0].elapsed or 1e-9
            bar.update(task_id, completed=done, total=total, rate=done / elapsed)
            bar.refresh()

        report = run_sweep(
            TriageJob(args.task),
            configs=chosen,
            depth=args.depth,
            jobs=args.jobs,
            progress=progress,
            store=_SWEEP_STORES[args.store],
            merge=not args.no_merge,
        )
    table = Table(title=f"sweep of {report.job}", title_justify="left")
    headers = ("configuration", "depth", "scenarios", "points", "finished", "duplicates")
    for header in (*headers, "lost", "questions", "paid twice", "failed checks", "errors"):
        table.add_column(header, justify="left" if header == "configuration" else "right")
    for row in report.rows():
        bad = "red" if (row.protected and not row.clean) or not row.swept else ""
        table.add_row(
            row.config + ("" if row.protected else " (baseline)"),
            str(row.depth),
            str(row.scenarios),
            str(row.points),
            str(row.finished),
            str(row.duplicates),
            str(row.lost),
            str(row.questions),
            str(row.paid_twice),
            str(row.failed_checks),
            str(row.errors),
            style=bad,
        )
    console.print(table)
    if args.text:
        args.text.write_text(report.text())
    if args.json:
        args.json.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    problems = report.problems()
    for problem in problems:
        errors.print(f"[red]problem:[/red] {problem}")
    return EXIT["failed"] if problems else EXIT["done"]


def _syscall_sweep(args: argparse.Namespace, console: Console, errors: Console) -> int:
    """``durably sweep --syscalls``: kill the triage run at every disk-changing system call."""
    from .sweep.syscalls import run_syscall_sweep, strace_available, triage_stores
    from .triage.job import TriageJob

    if not strace_available():
        errors.print("error: the system-call sweep needs strace: apt-get install strace")
        return EXIT["usage"]
    stores = triage_stores()
    chosen = {name: stores[name] for name in args.stores} if args.stores else stores
    report = run_syscall_sweep(
        TriageJob(args.task, sync=True),
        chosen,
        depth=args.depth,
        jobs=args.jobs,
        sample=args.sample,
        merge=not args.every,
        progress=_printer(errors, "system-call sweep"),
    )
    console.print(report.text(), highlight=False, markup=False)
    if args.text:
        args.text.write_text(report.text())
    if args.json:
        args.json.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    problems = report.problems()
    for problem in problems[:20]:
        errors.print(f"[red]problem:[/red] {problem}", highlight=False)
    return EXIT["failed"] if problems else EXIT["done"]


def _random_sweep(args: argparse.Namespace, console: Console, errors: Console) -> int:
    """``durably sweep --random RUNS``: kill the demo at random instants, several times a run."""
    from .sweep.randomkill import run_random_sweep

    report = run_random_sweep(
        task=args.task,
        runs=args.random,
        kills=args.kills,
        seed=args.seed,
        stores=args.stores or ("journal", "snapshot"),
        jobs=args.jobs,
        progress=_printer(errors, "random sweep"),
    )
    console.print(report.text(), highlight=False, markup=False)
    if args.text:
        args.text.write_text(report.text())
    if args.json:
        args.json.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    problems = report.problems()
    for problem in problems[:20]:
        errors.print(f"[red]problem:[/red] {problem}", highlight=False)
    return EXIT["failed"] if problems else EXIT["done"]


def _printer(errors: Console, what: str) -> Callable[[int, int], None]:
    """A progress callback printing "what: done/total" on stderr, at most every 10%."""
    shown = [-1]

    def progress(done: int, total: int) -> None:
        tenth = (10 * done) // max(total, 1)
        if tenth != shown[0] or done == total:
            shown[0] = tenth
            errors.print(f"{what}: {done}/{total}", highlight=False)

    return progress


def _positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is too small: give 1 or more")
    return value


def _non_negative_int(text: str) -> int:
    """An argparse type: a whole number of at least 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is too small: give 0 or more")
    return value


def _positive_amount(text: str) -> float:
    """An argparse type: a finite number above 0 (dollars, seconds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text} is not a positive amount: give more than 0")
    return value


def _run_id(text: str) -> str:
    """An argparse type: a valid run ID, checked before it is ever used in a path."""
    try:
        return validate_run_id(text)
    except InvalidRunId as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _output_file(text: str) -> Path:
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="durably",
        description="Durable LLM agent runs: crash at any instant, resume without repeats.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    commands = parser.add_subparsers(dest="command", required=True)

    def state_option(command: argparse.ArgumentParser) -> None:
        command.add_argument(
            "--state",
            type=Path,
            default=Path(".durably"),
            help="state directory (default: .durably)",
        )

    triage = commands.add_parser(
        "triage", help="run (or resume) the reference triage agent", epilog=_EPILOG
    )
    triage.add_argument(
        "--task", default="m1-done-after-delete", help="task name (default: %(default)s)"
    )
    state_option(triage)
    triage.add_argument(
        "--run", type=_run_id, help="resume this run ID instead of the task's unfinished run"
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
    triage.add_argument("--max-turns", type=_positive_int, default=40)
    triage.add_argument("--max-dollars", type=_positive_amount, default=5.0)
    triage.add_argument(
        "--max-resumes",
        type=_non_negative_int,
        default=10,
        help="restarts allowed over the run's life (default: 10); opening a paused run is "
        "not a restart",
    )
    triage.add_argument("--new", action="store_true", help="start a new run even if one is open")
    triage.set_defaults(handler=_cmd_triage)

    show_cmd = commands.add_parser("show", help="show one run's checkpoint")
    show_cmd.add_argument(
        "run", type=_run_id, help="run ID, or its start if no other run ID starts so"
    )
    state_option(show_cmd)
    show_cmd.add_argument("--json", action="store_true", help="print the state as JSON")
    show_cmd.set_defaults(handler=_cmd_show)

    sweep = commands.add_parser(
        "sweep", help="crash the triage agent at every crash point and count what went wrong"
    )
    sweep.add_argument(
        "--task", default="m1-done-after-delete", help="task name (default: %(default)s)"
    )
    sweep.add_argument("--depth", type=int, choices=(1, 2), default=2)
    sweep.add_argument(
        "--config",
        action="append",
        help="a configuration to sweep (repeatable; default: all): keys honoured, keys "
        "ignored, fickle model, lookups off, no refile guard, naive retry, at-most-once",
    )
    sweep.add_argument(
        "--no-merge",
        action="store_true",
        help="kill at every crash point, first and second, instead of once per run of points "
        "that leave the same disk (several times slower; checks that equivalence)",
    )
    sweep.add_argument(
        "--jobs", type=_positive_int, default=os.cpu_count() or 1, help="worker processes"
    )
    sweep.add_argument(
        "--store",
        choices=("snapshot", "journal"),
        default="snapshot",
        help="the store every scenario runs on: snapshot (default; the reference table's) "
        "or journal (the triage command's default)",
    )
    sweep.add_argument(
        "--power-loss",
        action="store_true",
        help="instead, check both stores against every legal disk after every power cut, "
        "and that every seeded mutant of the save protocol is caught",
    )
    sweep.add_argument(
        "--syscalls",
        action="store_true",
        help="instead, kill the run at every disk-changing system call (strace's fault "
        "injection), on both file stores (synced), at --depth 1 or 2",
    )
    sweep.add_argument(
        "--sample",
        type=_positive_int,
        help="with --syscalls: at most this many kills per call kind (default: every one)",
    )
    sweep.add_argument(
        "--every",
        action="store_true",
        help="with --syscalls: kill at every point, even where an earlier kill left the same disk",
    )
    sweep.add_argument(
        "--random",
        type=_positive_int,
        metavar="RUNS",
        help="instead, run the demo RUNS times, each killed at up to --kills random instants",
    )
    sweep.add_argument(
        "--kills", type=_positive_int, default=6, help="with --random: kills per run at most"
    )
    sweep.add_argument("--seed", type=int, default=0, help="with --random: the random seed")
    sweep.add_argument(
        "--stores",
        action="append",
        choices=("snapshot", "journal"),
        help="with --syscalls or --random: a store to use (repeatable; default: both)",
    )
    sweep.add_argument(
        "--json", type=_output_file, help="write every scenario as JSON to this file"
    )
    sweep.add_argument(
        "--text", type=_output_file, help="write the table as plain text to this file"
    )
    sweep.set_defaults(handler=_cmd_sweep)

    runs_cmd = commands.add_parser("runs", help="list runs")
    runs_cmd.add_argument(
        "store", nargs="?", metavar="STORE", help="a FileStore/JournalStore directory"
    )
    state_option(runs_cmd)
    runs_cmd.set_defaults(handler=_cmd_runs)
    _add_worker_commands(commands)
    from .cli_person import add_person_commands

    add_person_commands(commands, max_resumes=_positive_int)
    return parser


# -- Postgres workers: `durably worker` and `durably submit` ---------------------------
# Kept in one block: the commands live in durably.postgres.worker; only their wiring is here.


def _cmd_worker(args: argparse.Namespace, console: Console, errors: Console) -> int:
    import asyncio

    from .postgres.worker import serve

    try:
        asyncio.run(
            serve(
                dsn=args.dsn,
                concurrency=args.concurrency,
                state_dir=args.state,
                lease=args.lease,
                imports=args.imports,
                say=console.print,
            )
        )
    except ValueError as exc:
        errors.print(f"[red]error:[/red] {exc}")
        return EXIT["usage"]
    return EXIT["done"]


def _cmd_submit(args: argparse.Namespace, console: Console, errors: Console) -> int:
    import asyncio

    from .postgres.worker import submit_command

    try:
        run_id = asyncio.run(
            submit_command(
                dsn=args.dsn,
                agent_name=args.agent,
                task=args.task,
                run_id=args.run,
                imports=args.imports,
            )
        )
    except ValueError as exc:
        errors.print(f"[red]error:[/red] {exc}")
        return EXIT["usage"]
    console.print(run_id, highlight=False)
    return EXIT["done"]


def _add_worker_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def common(command: argparse.ArgumentParser) -> None:
        command.add_argument(
            "--dsn",
            default=os.environ.get("DURABLY_DSN"),
            required="DURABLY_DSN" not in os.environ,
            help="PostgreSQL connection string (default: $DURABLY_DSN)",
        )
        command.add_argument(
            "--import",
            dest="imports",
            action="append",
            default=[],
            metavar="MODULE",
            help="import MODULE first; it registers agents with durably.postgres.register",
        )

    worker = commands.add_parser(
        "worker", help="claim runs from a Postgres store and carry them on until SIGTERM"
    )
    common(worker)
    worker.add_argument(
        "--concurrency", type=_positive_int, default=4, help="runs at once (default: 4)"
    )
    worker.add_argument(
        "--state",
        type=Path,
        default=Path(".durably"),
        help="where triage runs keep their worlds (default: .durably)",
    )
    worker.add_argument(
        "--lease", type=_positive_amount, default=15.0, help="lease length in seconds (default: 15)"
    )
    worker.set_defaults(handler=_cmd_worker)

    submit = commands.add_parser("submit", help="queue a run for a worker to start")
    common(submit)
    submit.add_argument("--agent", required=True, help="registered agent name, e.g. triage:TASK")
    submit.add_argument("--task", help="the task (default: the agent's own, for triage)")
    submit.add_argument("--run", help="use this run ID (default: a new one)")
    submit.set_defaults(handler=_cmd_submit)


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


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of the ``durably`` command."""
    args = _parser().parse_args(argv)
    console, errors = _console(), _console(stderr=True)
    try:
        code = args.handler(args, console, errors)
    except DurablyError as exc:
        if args.debug:
            raise
        errors.print(f"[red]error:[/red] {exc}", soft_wrap=True, highlight=False)
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
        errors.print(
            f"[red]error:[/red] {exc}; {hint} (what was saved is kept)",
            soft_wrap=True,
            highlight=False,
        )
        code = EXIT["failed"]
    except KeyboardInterrupt:
        errors.print("interrupted; the run is saved where it stopped: run the command again")
        # Every save has landed and the run's store is closed by now. Tearing the
        # interpreter down (a provider SDK's modules) takes about a second, which a
        # person who pressed Ctrl-C should not wait for: flush and leave.
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(130)
    sys.exit(code)
