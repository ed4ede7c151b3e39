"""The report protocol every sweep's report follows, and the labelled and system-call reports.

A :class:`Report` names the job swept, the problems that fail the sweep (none
when clean), the table for people and the JSON for machines: the
``durably sweep`` command and the pytest helpers (:func:`raise_on_problems`)
treat every sweep's report alike. The four are :class:`SweepReport`,
:class:`SyscallReport`, :class:`~durably.sweep.powerloss.PowerLossReport` and
:class:`~durably.sweep.randomkill.RandomReport`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol, TypeVar

from .config import Config
from .judge import ScenarioResult
from .strace import KINDS

__all__ = ["Report", "Row", "SweepReport", "SyscallReport", "raise_on_problems"]


class Report(Protocol):
    """What every sweep's report gives: the job, its problems, its table, its JSON."""

    @property
    def job(self) -> str:
        """The name of the job swept."""
        ...

    def problems(self) -> list[str]:
        """Why the sweep fails, each in a line; empty when it is clean."""
        ...

    def text(self) -> str:
        """The report for people (the labelled sweep's table is kept in the repository)."""
        ...

    def to_json(self) -> dict[str, Any]:
        """The report for machines."""
        ...


R = TypeVar("R", bound=Report)


def raise_on_problems(report: R, *, most: int | None = None) -> R:
    """``report``, or ``AssertionError`` with its (first ``most``) problems and its text.

    What every sweep's pytest helper does with its report.
    """
    problems = report.problems()
    if problems:
        raise AssertionError("\n".join(problems[:most]) + "\n" + report.text())
    return report


@dataclass(frozen=True, kw_only=True)
class Row:
    """One line of the sweep's table: a configuration at a depth."""

    config: str
    depth: int
    protected: bool
    scenarios: int
    points: int
    finished: int
    duplicates: int
    lost: int
    questions: int
    paid_twice: int
    failed_checks: int
    errors: int = 0
    """Scenarios the harness could not run as planned (a kill that did not happen,
    a restart that failed): what they would have shown is unknown."""

    @property
    def swept(self) -> bool:
        """Every scenario ran as planned, and there was at least one."""
        return self.scenarios > 0 and not self.errors

    @property
    def clean(self) -> bool:
        """Swept, and no duplicate, loss, reply paid twice or failed check; every run finished."""
        return (
            self.swept
            and self.finished == self.scenarios
            and not (self.duplicates or self.lost or self.paid_twice or self.failed_checks)
        )


@dataclass(frozen=True, kw_only=True)
class SweepReport:
    """Every scenario of a sweep, and the table they add up to."""

    job: str
    results: tuple[ScenarioResult, ...]
    configs: tuple[Config, ...]
    depth: int

    def rows(self) -> list[Row]:
        """The table: one row per configuration and depth."""
        rows = []
        for config in self.configs:
            for depth in range(1, (self.depth if config.protected else 1) + 1):
                mine = [r for r in self.results if r.config == config.name and r.depth == depth]
                rows.append(
                    Row(
                        config=config.name,
                        depth=depth,
                        protected=config.protected,
                        scenarios=len(mine),
                        points=sum(r.covers for r in mine),
                        finished=sum(r.finished for r in mine),
                        duplicates=sum(r.duplicates for r in mine),
                        lost=sum(r.lost for r in mine),
                        questions=sum(r.questions for r in mine),
                        paid_twice=sum(r.paid_twice for r in mine),
                        failed_checks=sum(bool(r.failed_checks) for r in mine),
                        errors=sum(r.error is not None for r in mine),
                    )
                )
        return rows

    def problems(self) -> list[str]:
        """Why the sweep fails: a row not swept, a protected row not clean, a baseline clean.

        A row with no scenario, or with a scenario that errored, proves nothing
        either way, protected or baseline: it is a problem, and the first errors
        are named.
        """
        found = []
        for row in self.rows():
            where = f"{row.config} (depth {row.depth})"
            if row.scenarios == 0:
                found.append(f"{where} ran no scenario")
                continue
            if row.errors:
                found.append(f"{where}: {row.errors} of {row.scenarios} scenarios errored")
            harmed = row.finished < row.scenarios or any(
                (row.duplicates, row.lost, row.paid_twice, row.failed_checks)
            )
            if row.protected and harmed:
                found.append(f"{where} is not clean")
            if not row.protected and row.depth == 1 and row.clean:
                found.append(f"baseline {row.config} failed to fail")
        found += [
            f"{r.config} {' then '.join(r.crashes)}: {r.error}"
            for r in [r for r in self.results if r.error is not None][:5]
        ]
        return found

    def text(self) -> str:
        """The table as plain text (kept in the repository and compared by a test)."""
        header = (
            f"{'configuration':<16} {'depth':>5} {'scenarios':>9} {'points':>6} "
            f"{'finished':>8} {'duplicates':>10} {'lost':>4} {'questions':>9} "
            f"{'paid twice':>10} {'failed checks':>13} {'errors':>6}"
        )
        lines = [f"sweep of {self.job}", header, "-" * len(header)]
        for r in self.rows():
            lines.append(
                f"{r.config:<16} {r.depth:>5} {r.scenarios:>9} {r.points:>6} {r.finished:>8} "
                f"{r.duplicates:>10} {r.lost:>4} {r.questions:>9} {r.paid_twice:>10} "
                f"{r.failed_checks:>13} {r.errors:>6}"
            )
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        """The rows and every scenario, for machines; ``ok`` is False on any problem."""
        problems = self.problems()
        return {
            "job": self.job,
            "depth": self.depth,
            "ok": not problems,
            "problems": problems,
            "rows": [asdict(r) | {"clean": r.clean, "swept": r.swept} for r in self.rows()],
            "scenarios": [asdict(s) for s in self.results],
        }


@dataclass(frozen=True, kw_only=True)
class SyscallReport:
    """The sweep's table (rows per store and depth) and the kills per call kind."""

    report: SweepReport
    kinds: dict[tuple[str, int, str], tuple[int, int]]
    """(store, depth, kind) -> (kill points, real kills)."""
    unreachable: dict[str, int]
    """Per store: kill points strace's per-thread counter could not reach."""
    sample: int | None

    @property
    def job(self) -> str:
        """The name of the job swept."""
        return self.report.job

    def problems(self) -> list[str]:
        """Why the sweep fails: a row not clean, an errored scenario, an empty row."""
        found = list(self.report.problems())
        for row in self.report.rows():
            if row.scenarios == 0:
                found.append(f"{row.config} (depth {row.depth}) ran no scenario")
        for result in self.report.results:
            if result.error:
                found.append(f"{result.config} {' then '.join(result.crashes)}: {result.error}")
        return found

    def kinds_text(self) -> str:
        """Kill points and real kills per call kind, per store and depth."""
        stores = [c.name for c in self.report.configs]
        depths = range(1, self.report.depth + 1)
        header = f"{'call':<10}" + "".join(f" {f'{s} d{d}':>20}" for s in stores for d in depths)
        lines = ["kill points / real kills per call kind", header, "-" * len(header)]
        for kind in KINDS:
            cells = []
            for s in stores:
                for d in depths:
                    points, kills = self.kinds.get((s, d, kind), (0, 0))
                    cells.append(f" {f'{points} / {kills}':>20}")
            lines.append(f"{kind:<10}" + "".join(cells))
        unreachable = ", ".join(f"{s} {n}" for s, n in self.unreachable.items())
        lines.append(f"unreachable by strace's per-thread counter: {unreachable}")
        return "\n".join(lines) + "\n"

    def text(self) -> str:
        """The table, in the labelled sweep's format, then the kinds."""
        title = "system-call sweep" + (
            f" (sample: at most {self.sample} kills per call kind)" if self.sample else ""
        )
        table = self.report.text().replace("sweep of", f"{title} of", 1)
        return table + "\n" + self.kinds_text()

    def to_json(self) -> dict[str, Any]:
        """Rows, scenarios and kinds, for machines."""
        return self.report.to_json() | {
            "sample": self.sample,
            "kinds": [
                {"store": s, "depth": d, "kind": k, "points": p, "kills": n}
                for (s, d, k), (p, n) in sorted(self.kinds.items())
            ],
            "unreachable": self.unreachable,
        }
