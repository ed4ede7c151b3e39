"""``durably sweep``: crash the triage agent and count what went wrong.

At every crash point, power cut, system call or random instant.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .._exit import EXIT
from ._args import output_file, positive_int

if TYPE_CHECKING:
    from rich.console import Console

    from ..stores.file import FileStore

__all__ = ["add_sweep_command"]


class _Report(Protocol):
    """What every sweep's report gives the command: its table, its JSON, its problems."""

    def text(self) -> str: ...
    def to_json(self) -> dict[str, Any]: ...
    def problems(self) -> list[str]: ...


def _finish(report: _Report, args: argparse.Namespace, errors: Console, most: int | None) -> int:
    """Write the report where ``--text``/``--json`` ask, name its problems; the exit code."""
    from rich.markup import escape

    if args.text:
        args.text.write_text(report.text())
    if args.json:
        args.json.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    problems = report.problems()
    for problem in problems[:most]:
        errors.print(f"[red]problem:[/red] {escape(problem)}", highlight=False)
    return EXIT["failed"] if problems else EXIT["done"]


def _power_loss(task: str, jobs: int, console: Console, errors: Console) -> int:
    """Every power cut at every operation of both stores' saves: how many disks, how many wrong."""
    import functools

    from rich.table import Table

    from ..stores.file import FileStore
    from ..stores.journal import JournalStore
    from ..sweep.powerloss import MUTANTS, check_lock_exclusion, explore

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
    from ..sweep import CONFIGS
    from ..sweep.powerloss import run_power_loss_sweep
    from ..triage.job import TriageJob

    problems = 0
    for store in ("journal", "snapshot"):
        report = run_power_loss_sweep(TriageJob(task), config=CONFIGS[0], store=store, jobs=jobs)
        console.print(report.text().rstrip())
        for problem in report.problems()[:3]:
            errors.print(f"[red]problem:[/red] {problem}")
        problems += len(report.problems())
    return problems


def _mutant_caught(mutant: str) -> bool:
    from ..sweep.powerloss import MUTANTS, check_lock_exclusion, check_protocol, check_workspace

    if MUTANTS[mutant].caught_by == "check_workspace":
        return bool(check_workspace(mutant=mutant))
    return bool(check_protocol(saves=3, mutant=mutant) or check_lock_exclusion(mutant=mutant))


def _unsynced_journal(directory: Path) -> FileStore:
    from ..stores.journal import JournalStore

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

    from ..sweep import CONFIGS, run_sweep
    from ..triage.job import TriageJob
    from ..triage.world import TASKS

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
            chain=not args.no_chain,
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
    return _finish(report, args, errors, most=None)


def _syscall_sweep(args: argparse.Namespace, console: Console, errors: Console) -> int:
    """``durably sweep --syscalls``: kill the triage run at every disk-changing system call."""
    from ..sweep.syscalls import run_syscall_sweep, strace_available, triage_stores
    from ..triage.job import TriageJob

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
    return _finish(report, args, errors, most=20)


def _random_sweep(args: argparse.Namespace, console: Console, errors: Console) -> int:
    """``durably sweep --random RUNS``: kill the demo at random instants, several times a run."""
    from ..sweep.randomkill import run_random_sweep
    from ..triage.job import TriageDemo

    report = run_random_sweep(
        TriageDemo(args.task),
        runs=args.random,
        kills=args.kills,
        seed=args.seed,
        stores=args.stores or ("journal", "snapshot"),
        jobs=args.jobs,
        progress=_printer(errors, "random sweep"),
    )
    console.print(report.text(), highlight=False, markup=False)
    return _finish(report, args, errors, most=20)


def _printer(errors: Console, what: str) -> Callable[[int, int], None]:
    """A progress callback printing "what: done/total" on stderr, at most every 10%."""
    shown = [-1]

    def progress(done: int, total: int) -> None:
        tenth = (10 * done) // max(total, 1)
        if tenth != shown[0] or done == total:
            shown[0] = tenth
            errors.print(f"{what}: {done}/{total}", highlight=False)

    return progress


def add_sweep_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``durably sweep`` on the ``durably`` parser."""
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
        "--no-chain",
        action="store_true",
        help="start a process for every kill, instead of killing one process at each of a run's "
        "points in turn (slower; checks that chaining judges alike)",
    )
    sweep.add_argument(
        "--jobs", type=positive_int, default=os.cpu_count() or 1, help="worker processes"
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
        type=positive_int,
        help="with --syscalls: at most this many kills per call kind (default: every one)",
    )
    sweep.add_argument(
        "--every",
        action="store_true",
        help="with --syscalls: kill at every point, even where an earlier kill left the same disk",
    )
    sweep.add_argument(
        "--random",
        type=positive_int,
        metavar="RUNS",
        help="instead, run the demo RUNS times, each killed at up to --kills random instants",
    )
    sweep.add_argument(
        "--kills", type=positive_int, default=6, help="with --random: kills per run at most"
    )
    sweep.add_argument("--seed", type=int, default=0, help="with --random: the random seed")
    sweep.add_argument(
        "--stores",
        action="append",
        choices=("snapshot", "journal"),
        help="with --syscalls or --random: a store to use (repeatable; default: both)",
    )
    sweep.add_argument("--json", type=output_file, help="write every scenario as JSON to this file")
    sweep.add_argument(
        "--text", type=output_file, help="write the table as plain text to this file"
    )
    sweep.set_defaults(handler=_cmd_sweep)
