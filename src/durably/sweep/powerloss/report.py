"""The power-loss sweep's report: each distinct disk, how it loaded, how its resumed run ended."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..judge import ScenarioResult
from .checks import Violation

__all__ = ["PowerLossReport", "PowerLossScenario"]


@dataclass(frozen=True, kw_only=True)
class PowerLossScenario:
    """One distinct disk at one crash point: how it loaded, and how the resumed run ended."""

    point: int
    """The crash point (1-based index in the crash-free run) where the power went."""
    label: str
    image: str
    """Which unsynced operations survived, in words."""
    covers: int
    """How many (point, image) pairs this scenario stands for (identical captures)."""
    loaded: str
    """What the fresh store loaded: ``save N (...)``, ``RunNotFound`` or an error."""
    expected: str
    violation: Violation | None
    result: ScenarioResult
    """The resumed run, judged as the crash sweep judges."""


@dataclass(frozen=True, kw_only=True)
class PowerLossReport:
    """Every scenario of a power-loss sweep, and what they add up to."""

    job: str
    config: str
    store: str
    points: int
    """Crash points of the crash-free run."""
    captured: int
    """Crash points captured (every ``every``-th)."""
    pairs: int
    """(point, image) pairs captured, before merging identical ones."""
    saves: int
    """Saves the crash-free run made."""
    captured_labels: dict[str, int]
    """Captured crash points by label (a point whose disks all equal earlier
    captures is covered by those scenarios, and counted here)."""
    scenarios: tuple[PowerLossScenario, ...]

    @property
    def violations(self) -> list[Violation]:
        """Disks that loaded as something other than the old or the new state."""
        return [s.violation for s in self.scenarios if s.violation is not None]

    def totals(self) -> dict[str, int]:
        """Scenario counts: finished, duplicates, lost, questions, paid twice, failed checks."""
        results = [s.result for s in self.scenarios]
        return {
            "scenarios": len(results),
            "finished": sum(r.finished for r in results),
            "duplicates": sum(r.duplicates for r in results),
            "lost": sum(r.lost for r in results),
            "questions": sum(r.questions for r in results),
            "paid_twice": sum(r.paid_twice for r in results),
            "failed_checks": sum(bool(r.failed_checks) for r in results),
            "violations": len(self.violations),
        }

    def problems(self) -> list[str]:
        """Why the sweep fails: a load violation, or a resumed run that went wrong."""
        found = [f"{v}" for v in self.violations]
        for s in self.scenarios:
            r = s.result
            if not r.finished or r.duplicates or r.lost or r.paid_twice or r.failed_checks:
                found.append(
                    f"point {s.point} ({s.label}) on [{s.image}]: finished={r.finished} "
                    f"duplicates={r.duplicates} lost={r.lost} paid_twice={r.paid_twice} "
                    f"failed={list(r.failed_checks)} error={r.error}"
                )
        return found

    def to_json(self) -> dict[str, Any]:
        """The totals, the problems and every scenario, for machines."""
        problems = self.problems()
        return {
            "job": self.job,
            "config": self.config,
            "store": self.store,
            "points": self.points,
            "captured": self.captured,
            "pairs": self.pairs,
            "saves": self.saves,
            "ok": not problems,
            "problems": problems,
            "totals": self.totals(),
            "captured_labels": self.captured_labels,
            "scenarios": [asdict(s) for s in self.scenarios],
        }

    def text(self) -> str:
        """One line of totals, for people."""
        t = self.totals()
        return (
            f"power-loss sweep of {self.job} ({self.config}, {self.store} store): "
            f"{self.captured}/{self.points} points, {self.pairs} disks, "
            f"{t['scenarios']} scenarios, {t['violations']} load violations, "
            f"{t['finished']} finished, {t['duplicates']} duplicates, {t['lost']} lost, "
            f"{t['questions']} questions, {t['paid_twice']} paid twice, "
            f"{t['failed_checks']} failed checks\n"
        )
