"""``durably sweep``: crash the triage agent and count what went wrong.

At every crash point, power cut, system call or random instant.
"""

from __future__ import annotations

import argparse
import json
import os
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from .._exit import EXIT
from ._args import output_file, positive_int

if TYPE_CHECKING:
    from rich.console import Console

    from ..stores.file import FileStore
    from ..sweep.core import Config, Row, ScenarioResult
    from ..sweep.report import Report
    from ._sweep_view import Bar

__all__ = ["add_sweep_command"]


def _finish(report: Report, args: argparse.Namespace, errors: Console, most: int | None) -> int:
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


def _power_loss(task: str, jobs: int, console: Console, errors: Console) -> int:  # noqa: C901, PLR0915 - the command's stages (explore, run, table, verdict) in the order a person reads them
    """Every power cut at every operation of both stores' saves: how many disks, how many wrong.

    Ten phases, each named on the progress line with how far it is, and each
    logged with what it took when done; Ctrl-C or SIGTERM prints what ran.
    """
    import functools

    from rich.table import Table

    from ..stores.file import FileStore
    from ..stores.journal import JournalStore
    from ..sweep._output import captured
    from ..sweep.powerloss import MUTANTS, check_lock_exclusion, explore
    from ._sweep_view import Bar, Terminated, clock, interrupt_exit, interruptible, print_children

    stores: dict[str, Callable[..., FileStore]] = {
        "snapshot": FileStore,
        "journal": JournalStore,
        "journal, compacting": functools.partial(
            JournalStore, compact_min_bytes=0, compact_ratio=0.5
        ),
    }
    table = Table(title="power-loss model: every legal disk after every operation")
    for header in ("store", "mode", "points", "disk states", "images", "violations"):
        table.add_column(header, justify="left" if header in ("store", "mode") else "right")
    phases = 2 * len(stores) + 4
    phase = [0]
    found: list[str] = []
    wrong: list[str] = []
    stopped: KeyboardInterrupt | None = None

    def begin(what: str) -> float:
        phase[0] += 1
        bar.stage(f"power loss {phase[0]}/{phases}: {what}")
        return bar.elapsed

    def done(what: str, since: float) -> None:
        found.append(f"{what} ({clock(bar.elapsed - since)})")
        errors.print(f"power loss {phase[0]}/{phases}: {what} in {clock(bar.elapsed - since)}")

    with Bar(errors, "scenarios") as bar:
        try:
            with captured() as children, interruptible():
                for name, store in stores.items():
                    for resume in (False, True):
                        mode = "open (restart)" if resume else "read"
                        since = begin(f"model, {name}, {mode}")
                        explored = explore(saves=4, store=store, resume=resume)
                        table.add_row(
                            name,
                            mode,
                            str(explored.points),
                            str(explored.states),
                            str(explored.images),
                            str(len(explored.violations)),
                            style="red" if explored.violations else "",
                        )
                        for violation in explored.violations[:3]:
                            errors.print(f"[red]violation:[/red] {name}: {violation}")
                        if explored.violations:
                            wrong.append(f"{name} ({mode}): {len(explored.violations)} violations")
                        done(f"{name}, {mode}: {explored.states} disk states", since)
                since = begin("lock exclusion")
                lock = check_lock_exclusion()
                if lock:
                    wrong.append(f"lock exclusion: {len(lock)} violations")
                done(f"lock exclusion: {len(lock)} violations", since)
                since = begin("seeded mutants")
                caught = 0
                for index, mutant in enumerate(MUTANTS):
                    bar.progress(index, len(MUTANTS))
                    caught += _mutant_caught(mutant)
                if caught != len(MUTANTS):
                    wrong.append(f"{len(MUTANTS) - caught} of {len(MUTANTS)} mutants not caught")
                done(f"seeded mutants caught: {caught}/{len(MUTANTS)}", since)
                resumed = _power_loss_runs(task, jobs, errors, bar, begin, done, wrong)
        except KeyboardInterrupt as exc:
            stopped = exc
    console.print(table)
    if stopped is not None:
        why = "SIGTERM" if isinstance(stopped, Terminated) else "Ctrl-C"
        for line in found:
            console.print(f"done: {line}", highlight=False)
        _say(
            console,
            f"verdict: partial — stopped by {why} in phase {phase[0]} of {phases}"
            + (f"; wrong so far: {'; '.join(wrong)}" if wrong else ""),
            ok=False,
        )
        print_children(errors, children.summary())
        return interrupt_exit(stopped)
    console.print(
        f"lock exclusion: {len(lock)} violations; seeded mutants caught: {caught}/{len(MUTANTS)}"
    )
    for text in resumed:
        console.print(text, highlight=False, markup=False)
    if wrong:
        _say(console, "verdict: NOT CLEAN — " + "; ".join(wrong), ok=False)
    else:
        _say(
            console,
            f"verdict: clean — no legal disk after any power cut lost a save ({len(stores)} "
            f"stores, read and reopened), lock exclusion held, {caught}/{len(MUTANTS)} seeded "
            "mutants caught, the triage run resumed correctly on every disk",
            ok=True,
        )
    console.print(f"power-loss sweep: {phases} phases in {clock(bar.elapsed)}", highlight=False)
    print_children(errors, children.summary())
    return EXIT["failed"] if wrong else EXIT["done"]


def _say(console: Console, line: str, *, ok: bool) -> None:
    """A verdict line, wrapped to the console's width, green when clean."""
    console.print(
        textwrap.fill(line, width=console.width, subsequent_indent="  ", break_on_hyphens=False),
        style="green" if ok else "red",
        highlight=False,
        markup=False,
    )


def _power_loss_runs(  # noqa: PLR0917 - private, one caller, the progress hooks it shares
    task: str,
    jobs: int,
    errors: Console,
    bar: Bar,
    begin: Callable[[str], float],
    done: Callable[[str, float], None],
    wrong: list[str],
) -> list[str]:
    """The triage run resumed on every disk a power cut can leave, for each store: its reports."""
    from ..sweep import CONFIGS
    from ..sweep.powerloss import run_power_loss_sweep
    from ..triage.job import TriageJob

    texts = []
    for store in ("journal", "snapshot"):
        since = begin(f"triage on {store} disks")
        report = run_power_loss_sweep(
            TriageJob(task), config=CONFIGS[0], store=store, jobs=jobs, progress=bar.progress
        )
        texts.append(report.text().rstrip())
        for problem in report.problems()[:3]:
            errors.print(f"[red]problem:[/red] {problem}")
        if report.problems():
            wrong.append(f"triage on the {store} store: {len(report.problems())} problems")
        done(f"triage resumed on the {store} store: {len(report.scenarios)} disks", since)
    return texts


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
    from ..sweep import CONFIGS
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
    return _crash_sweep(args, [known[name] for name in args.config or known], console, errors)


def _crash_sweep(
    args: argparse.Namespace, chosen: list[Config], console: Console, errors: Console
) -> int:
    """The labelled sweep: a bar over first crashes, the table, the verdict, children counted."""
    from ..sweep import run_sweep
    from ..sweep._output import captured
    from ..sweep.core import SweepReport
    from ..triage.job import TriageJob
    from ._sweep_view import Bar, Terminated, clock, interrupt_exit, interruptible, print_children

    job = TriageJob(args.task)
    ran: list[ScenarioResult] = []
    with Bar(errors, "first crashes") as bar:
        bar.stage("sweep: recording crash points")

        def progress(done: int, total: int) -> None:
            if not firsts[1]:  # the first call: recording is over, the scenarios begin
                bar.stage("sweep: first crashes")
            firsts[1] = total
            bar.extra = f"{len(ran)} scenarios"
            bar.progress(done, total)

        firsts = [0, 0]
        try:
            with captured() as children, interruptible():
                report = run_sweep(
                    job,
                    configs=chosen,
                    depth=args.depth,
                    jobs=args.jobs,
                    progress=progress,
                    store=_SWEEP_STORES[args.store],
                    merge=not args.no_merge,
                    chain=not args.no_chain,
                    on_results=ran.extend,
                )
        except KeyboardInterrupt as exc:
            stopped: KeyboardInterrupt | None = exc
        else:
            stopped = None
    taken = f"{len(ran)} scenarios in {clock(bar.elapsed)}"
    if stopped is not None:
        partial = SweepReport(
            job=job.name, results=tuple(ran), configs=tuple(chosen), depth=args.depth
        )
        # Each first crash judged has its one depth-1 scenario among those that ran.
        firsts[0] = sum(result.depth == 1 for result in ran)
        why = "SIGTERM" if isinstance(stopped, Terminated) else "Ctrl-C"
        _show_rows(
            console,
            f"sweep of {partial.job} (partial: stopped by {why})",
            partial.rows(),
            partial=(
                f"stopped by {why} after {firsts[0]} of {firsts[1]} first crashes ({taken})"
                if firsts[1]
                else f"stopped by {why} before the first scenario"
            ),
        )
        print_children(errors, children.summary())
        errors.print("the --text and --json reports are not written for a partial sweep")
        return interrupt_exit(stopped)
    _show_rows(console, f"sweep of {report.job}", report.rows())
    console.print(f"swept {taken} ({args.jobs} workers)", highlight=False)
    print_children(errors, children.summary())
    return _finish(report, args, errors, most=None)


def _show_rows(console: Console, title: str, rows: list[Row], partial: str | None = None) -> None:
    """The rows' table (80 columns wide at most), its legend and the verdict line."""
    from ._sweep_view import LEGEND, print_verdict, row_table

    console.print(row_table(title, rows))
    console.print(textwrap.fill(LEGEND, width=console.width), style="dim", highlight=False)
    print_verdict(console, rows, partial=partial)


def _syscall_sweep(args: argparse.Namespace, console: Console, errors: Console) -> int:
    """``durably sweep --syscalls``: kill the triage run at every disk-changing system call."""
    from ..sweep._output import captured
    from ..sweep.core import Config, SweepReport
    from ..sweep.syscalls import run_syscall_sweep, strace_available, triage_stores
    from ..triage.job import TriageJob
    from ._sweep_view import (
        Bar,
        Terminated,
        clock,
        interrupt_exit,
        interruptible,
        kinds_table,
        print_children,
    )

    if not strace_available():
        errors.print("error: the system-call sweep needs strace: apt-get install strace")
        return EXIT["usage"]
    stores = triage_stores()
    chosen = {name: stores[name] for name in args.stores} if args.stores else stores
    job = TriageJob(args.task, sync=True)
    ran: list[ScenarioResult] = []
    stopped: KeyboardInterrupt | None = None
    with Bar(errors, "first kills") as bar:

        def progress(done: int, total: int) -> None:
            bar.extra = f"{len(ran)} scenarios"
            bar.progress(done, total)

        try:
            with captured() as children, interruptible():
                report = run_syscall_sweep(
                    job,
                    chosen,
                    depth=args.depth,
                    jobs=args.jobs,
                    sample=args.sample,
                    merge=not args.every,
                    progress=progress,
                    stage=bar.stage,
                    on_results=ran.extend,
                )
        except KeyboardInterrupt as exc:
            stopped = exc
    taken = f"{len(ran)} scenarios in {clock(bar.elapsed)}"
    if stopped is not None:
        partial = SweepReport(
            job=job.name,
            results=tuple(ran),
            configs=tuple(Config(name=name) for name in chosen),
            depth=args.depth,
        )
        why = "SIGTERM" if isinstance(stopped, Terminated) else "Ctrl-C"
        _show_rows(
            console,
            f"system-call sweep of {job.name} (partial: stopped by {why})",
            partial.rows(),
            partial=f"stopped by {why} ({taken})",
        )
        print_children(errors, children.summary())
        errors.print("the --text and --json reports are not written for a partial sweep")
        return interrupt_exit(stopped)
    title = "system-call sweep" + (
        f" (sample: at most {args.sample} kills per call kind)" if args.sample else ""
    )
    _show_rows(console, f"{title} of {report.report.job}", report.report.rows())
    console.print(kinds_table(report))
    console.print(f"swept {taken} ({args.jobs} workers)", highlight=False)
    print_children(errors, children.summary())
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
