"""What ``durably sweep`` shows while it runs and when it ends.

A progress bar whose total is fixed before the first scenario and whose time
left is the mean pace so far; a table narrow enough for 80 columns, with a
legend; a verdict line; what the sweep's child processes wrote, counted.
Imported by the command's handler only (Rich is imported here).
"""

from __future__ import annotations

import signal
import textwrap
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

from rich import box
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TextColumn
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from rich.console import Console

    from ..sweep.core import Row
    from ..sweep.syscalls import SyscallReport

__all__ = [
    "LEGEND",
    "Bar",
    "Terminated",
    "interruptible",
    "kinds_table",
    "row_table",
    "verdict",
]


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the sweep's parent is, so it stops as on Ctrl-C and says what ran."""


@contextmanager
def interruptible() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` in here (workers reset it to the default)."""

    def terminate(signum: int, frame: FrameType | None) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def interrupt_exit(exc: KeyboardInterrupt) -> int:
    """The shell's code for the signal that stopped the sweep: 143 for SIGTERM, 130 for SIGINT."""
    return 128 + (signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)


def clock(seconds: float) -> str:
    """``m:ss`` (or ``h:mm:ss``)."""
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02}:{secs:02}" if hours else f"{minutes}:{secs:02}"


class Bar:
    """A progress line on stderr: what runs now, done/total, time taken, time left.

    Time left is the pace so far (time per unit since the stage began) times
    the units left, shown once one unit is done; the total a stage is given
    first is the one it keeps. Refreshed from the calling thread only: the
    sweep forks, and a refresh thread could hold the console's lock then.
    """

    def __init__(self, errors: Console, unit: str) -> None:
        self._unit = unit
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=10),
            MofNCompleteColumn(),
            TextColumn("{task.fields[extra]}"),
            _Times(),
            console=errors,
            auto_refresh=False,
            transient=True,
        )
        self._task: Any = None
        self._base: int | None = None
        self._started = time.monotonic()
        self.extra = ""

    def __enter__(self) -> Bar:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(None, None, None)

    def stage(self, what: str) -> None:
        """A new stage: its own line, total and pace (the earlier one is printed, done)."""
        if self._task is not None:
            self._progress.remove_task(self._task)
        self._task = self._progress.add_task(what, total=None, extra=self.extra, unit=self._unit)
        self._base = None
        self._progress.refresh()

    def progress(self, done: int, total: int) -> None:
        """A progress callback; a stage's units are counted from its first call."""
        if self._task is None:
            self.stage(self._unit)
        if self._base is None:
            self._base = done
        self._progress.update(
            self._task, completed=done - self._base, total=total - self._base, extra=self.extra
        )
        self._progress.refresh()

    @property
    def elapsed(self) -> float:
        """Seconds since the bar was made."""
        return time.monotonic() - self._started


class _Times(ProgressColumn):
    """Time taken, then time left at the pace so far (``~m:ss left``; "estimating" before)."""

    def render(self, task: Task) -> Text:
        taken = clock(task.elapsed or 0)
        if task.total is None or not task.completed:
            return Text(f"{taken}, estimating", style="progress.remaining")
        if task.completed >= task.total:
            return Text(taken, style="progress.elapsed")
        pace = (task.elapsed or 0) / task.completed
        left = clock(pace * (task.total - task.completed))
        return Text(f"{taken}, ~{left} left", style="progress.remaining")


LEGEND = (
    "d depth · scen scenarios · points crash points they cover · fin finished · "
    "dup duplicate effects · lost lost effects · asked questions asked of a person · "
    "paid2 saved replies paid for twice · chk failed checks · err scenarios the harness "
    "could not run · (b) a baseline, built to fail"
)
"""What each abbreviated header of :func:`row_table` means."""

_HEADERS = ("configuration", "d", "scen", "points", "fin", "dup", "lost", "asked", "paid2", "chk")


def row_table(title: str, rows: Sequence[Row]) -> Any:
    """The sweep's rows as a Rich table that fits 80 columns (headers as :data:`LEGEND` says)."""
    table = Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 0)
    )
    for header in (*_HEADERS, "err"):
        table.add_column(header, justify="left" if header == "configuration" else "right")
        table.columns[-1].no_wrap = True
    for row in rows:
        bad = "red" if (row.protected and not row.clean) or not row.swept else ""
        table.add_row(
            row.config + ("" if row.protected else " (b)"),
            *(
                str(n)
                for n in (
                    row.depth,
                    row.scenarios,
                    row.points,
                    row.finished,
                    row.duplicates,
                    row.lost,
                    row.questions,
                    row.paid_twice,
                    row.failed_checks,
                    row.errors,
                )
            ),
            style=bad,
        )
    return table


def kinds_table(report: SyscallReport) -> Table:
    """Kill points / real kills per call kind, per store and depth (the text report's, narrower)."""
    from ..sweep.syscalls import KINDS

    stores = [c.name for c in report.report.configs]
    depths = range(1, report.report.depth + 1)
    table = Table(
        title="kill points / real kills per call kind",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1),
    )
    table.add_column("call")
    for store in stores:
        for depth in depths:
            table.add_column(f"{store} d{depth}", justify="right", no_wrap=True)
    for kind in KINDS:
        cells = []
        for store in stores:
            for depth in depths:
                points, kills = report.kinds.get((store, depth, kind), (0, 0))
                cells.append(f"{points} / {kills}")
        table.add_row(kind, *cells)
    unreachable = ", ".join(f"{s} {n}" for s, n in report.unreachable.items())
    table.caption = f"unreachable by strace's per-thread counter: {unreachable}"
    table.caption_justify = "left"
    return table


def _harms(row: Row) -> list[str]:
    """What a row shows went wrong (or, for a baseline, what it shows it does)."""
    found = []
    if row.scenarios == 0:
        return ["no scenario ran"]
    if row.errors:
        found.append(f"{row.errors} of {row.scenarios} scenarios errored")
    if row.finished < row.scenarios:
        found.append(f"{row.scenarios - row.finished} of {row.scenarios} unfinished")
    for count, what in (
        (row.duplicates, "duplicates"),
        (row.lost, "lost"),
        (row.paid_twice, "replies paid twice"),
        (row.failed_checks, "failed checks"),
    ):
        if count:
            found.append(f"{count} {what}")
    return found


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def verdict(rows: Sequence[Row], *, partial: str | None = None) -> tuple[bool, str]:
    """Whether the rows prove what a sweep must, and the line that says so.

    Clean: every protected row ran every scenario with no duplicate, loss,
    reply paid twice or failed check, and every baseline (depth 1) failed.
    ``partial`` (why the sweep stopped early) makes it never clean.
    """
    protected = [row for row in rows if row.protected]
    baselines = [row for row in rows if not row.protected and row.depth == 1]
    wrong = [
        f"{row.config} (depth {row.depth}): {', '.join(_harms(row))}"
        for row in protected
        if not row.clean
    ]
    wrong += [
        f"baseline {row.config} failed to fail"
        + (f" ({', '.join(_harms(row))})" if not row.swept else "")
        for row in baselines
        if row.clean or not row.swept
    ]
    failing = "; ".join(
        f"{row.config}: {', '.join(_harms(row))}"
        for row in baselines
        if row.swept and not row.clean
    )
    if partial is not None:
        ran = [row for row in rows if row.scenarios]
        line = f"verdict: partial — {partial}"
        if len(ran) < len(rows):
            line += f"; only {len(ran)} of {len(rows)} rows ran any scenario"
        if wrong:
            line += "; wrong so far: " + "; ".join(w for w in wrong if "no scenario ran" not in w)
        return False, line
    if wrong:
        return False, "verdict: NOT CLEAN — " + "; ".join(wrong)
    line = (
        f"verdict: clean — {_count(len(protected), 'protected row')} with no duplicate, loss, "
        "reply paid twice or failed check"
    )
    if baselines:
        line += f"; {_count(len(baselines), 'baseline')} failed as they must ({failing})"
    return True, line


def print_verdict(console: Console, rows: Sequence[Row], *, partial: str | None = None) -> bool:
    """Print :func:`verdict`'s line (green when clean); whether it is."""
    ok, line = verdict(rows, partial=partial)
    console.print(
        textwrap.fill(line, width=console.width, subsequent_indent="  ", break_on_hyphens=False),
        style="green" if ok else "red",
        highlight=False,
        markup=False,
    )
    return ok


def print_children(errors: Console, lines: Sequence[str]) -> None:
    """What the sweep's child processes wrote, counted (:mod:`durably.sweep._output`)."""
    for line in lines:
        errors.print(line, highlight=False, markup=False)
