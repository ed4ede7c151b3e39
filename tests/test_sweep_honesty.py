"""A sweep that could not look is a failed sweep: errored scenarios and empty rows are problems.

And the sweep's shortcut, one scenario per run of points with equal fingerprints,
judges exactly as killing at every point does.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from _helpers.mutants import ENV
from _helpers.patience import stretched
from durably.sweep import (
    CONFIGS,
    Config,
    ScenarioResult,
    SweepReport,
    assert_clean,
    labelled,
    run_sweep,
)
from durably.sweep import batch as sweep_batch
from durably.sweep.judge import distinct
from durably.sweep.powerloss import Kind, PowerLossReport, PowerLossScenario, Violation
from durably.sweep.randomkill import RandomReport, RandomRun
from durably.sweep.report import Report, SyscallReport, raise_on_problems

TESTS = Path(__file__).parent
SITE = TESTS / "_helpers" / "mutant_site"
PROTECTED = Config(name="protected")
BASELINE = Config(name="baseline", baseline="naive-retry")


def _result(config: Config, at: int, **verdict: Any) -> ScenarioResult:
    fields: dict[str, Any] = {
        "finished": True,
        "duplicates": 0,
        "lost": 0,
        "questions": 0,
        "paid_twice": 0,
        "failed_checks": (),
    }
    fields.update(verdict)
    return ScenarioResult(
        config=config.name, depth=1, at=(at,), crashes=(f"point {at}",), covers=1, **fields
    )


def _report(*results: ScenarioResult, configs: tuple[Config, ...] = (PROTECTED,)) -> SweepReport:
    return SweepReport(job="test", results=results, configs=configs, depth=1)


def test_an_errored_scenario_makes_a_clean_looking_row_a_problem() -> None:
    """A row whose counts are all zero but whose scenario errored is not clean, and says why."""
    report = _report(
        _result(PROTECTED, 1),
        _result(PROTECTED, 2, error="the first process did not die at point 2 (status 0)"),
    )
    (row,) = report.rows()
    assert (row.errors, row.swept, row.clean) == (1, False, False)
    problems = report.problems()
    assert "protected (depth 1): 1 of 2 scenarios errored" in problems
    assert any("did not die at point 2" in p for p in problems)
    data = report.to_json()
    assert data["ok"] is False
    assert data["rows"][0]["errors"] == 1
    assert data["rows"][0]["clean"] is False
    assert report.text().splitlines()[1].split()[-1] == "errors"


def test_a_row_with_no_scenario_is_a_problem() -> None:
    """An empty row proves nothing, so it fails the sweep instead of counting as clean."""
    report = _report(configs=(PROTECTED, BASELINE))
    assert [r.clean for r in report.rows()] == [False, False]
    assert report.problems() == [
        "protected (depth 1) ran no scenario",
        "baseline (depth 1) ran no scenario",
    ]
    assert report.to_json()["ok"] is False


def test_a_baseline_that_only_errored_has_not_failed_as_it_must() -> None:
    """A baseline row of errors is a problem of its own, not a baseline shown to fail."""
    report = _report(_result(BASELINE, 1, error="restart 1 failed"), configs=(BASELINE,))
    assert report.problems()[0] == "baseline (depth 1): 1 of 1 scenarios errored"


def test_a_clean_report_has_no_problem() -> None:
    """The same table without the error passes: the rule is about errors, not about rows."""
    report = _report(_result(PROTECTED, 1), _result(PROTECTED, 2))
    assert report.problems() == []
    assert report.to_json()["ok"] is True


def test_assert_clean_raises_on_an_errored_scenario(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pytest helper fails on a sweep whose only flaw is an errored scenario."""
    errored = _report(_result(PROTECTED, 1, error="restart 1 failed (status 256)"))
    monkeypatch.setattr(labelled, "run_sweep", lambda *a, **k: errored)
    with pytest.raises(AssertionError, match="1 of 1 scenarios errored"):
        assert_clean(object(), configs=[PROTECTED])  # type: ignore[arg-type]


@pytest.mark.slow
def test_the_sweep_command_exits_1_when_no_kill_happens(tmp_path: Path) -> None:
    """With every kill a no-op (each scenario errors), ``durably sweep`` exits 1, says why,
    and its JSON is not ok, though every count in the table is zero.
    """
    env = dict(os.environ)
    env[ENV] = "a kill that does nothing"
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(SITE), str(TESTS), env.get("PYTHONPATH", "")) if p
    )
    report = tmp_path / "sweep.json"
    command = [sys.executable, "-m", "durably", "sweep", "--depth", "1", "--jobs", "2"]
    done = subprocess.run(
        [*command, "--config", "keys honoured", "--json", str(report)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=stretched(600),
        check=False,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "scenarios errored" in done.stderr
    found = json.loads(report.read_text())
    assert found["ok"] is False
    (row,) = found["rows"]
    assert row["errors"] == row["scenarios"] > 0
    assert (row["duplicates"], row["lost"], row["paid_twice"], row["failed_checks"]) == (0,) * 4


def _verdict(result: ScenarioResult) -> tuple[object, ...]:
    checks = tuple(sorted(name.split(":")[0] for name in result.failed_checks))
    return (
        result.finished,
        result.duplicates,
        result.lost,
        result.questions,
        result.paid_twice,
        checks,
        result.error is None,
    )


EQUIVALENCE_CONFIGS = ("lookups off", "no refile guard", "naive retry", "at-most-once")
"""Checked point by point in CI: the rows with questions, duplicates and losses to hide, and
the one where a repeated filing shows. All seven took 9.5 minutes on a loaded 2-core machine
(``durably sweep --depth 1 --no-merge``), every protected point clean."""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_merged_and_unmerged_sweeps_judge_every_point_alike() -> None:
    """At depth 1, killing at every labelled point judges each point as the merged sweep's
    scenario that stands for it does: fingerprint equivalence hides nothing.
    """
    from durably.triage.job import TriageJob

    configs = [c for c in CONFIGS if c.name in EQUIVALENCE_CONFIGS]
    merged = run_sweep(TriageJob(), configs=configs, depth=1, jobs=2, workers="fresh")
    unmerged = run_sweep(
        TriageJob(), configs=configs, depth=1, jobs=2, workers="fresh", merge=False
    )
    assert merged.problems() == unmerged.problems() == []
    by_point = {(r.config, r.at[0]): r for r in unmerged.results}
    assert all(r.covers == 1 for r in unmerged.results)
    weighted: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for scenario in merged.results:
        for point in range(scenario.at[0], scenario.at[0] + scenario.covers):
            alone = by_point.pop((scenario.config, point))
            assert _verdict(alone) == _verdict(scenario), (scenario.config, point, alone.crashes)
        for count in ("duplicates", "lost", "questions", "paid_twice"):
            weighted[scenario.config][count] += getattr(scenario, count) * scenario.covers
    assert by_point == {}  # every point was stood for by exactly one merged scenario
    for mine, theirs in zip(merged.rows(), unmerged.rows(), strict=True):
        assert mine.points == theirs.points == theirs.scenarios
        assert mine.scenarios < theirs.scenarios
        for count in ("duplicates", "lost", "questions", "paid_twice"):
            assert weighted[mine.config][count] == getattr(theirs, count), (mine.config, count)


def _open_descriptors() -> int:
    # Collect first: an earlier test's garbage closing its files mid-test would hide a leak.
    gc.collect()
    return len(os.listdir("/proc/self/fd"))


def test_a_scenario_leaves_no_descriptor_open_in_its_worker() -> None:
    """Scenarios (kill, restarts, judging) leave their worker's open files as they were."""
    from durably.triage.job import TriageJob

    job, config = TriageJob(), CONFIGS[0]
    labels, prints, reference = labelled.record_points(job, config, None)
    groups = [
        sweep_batch.Group(config, index, labels[index - 1], covers, 1)
        for index, covers in distinct(prints)
    ][-4:]  # the last points: the run's whole checkpoint is read at each
    sweep_batch.run_group(job, groups[0], reference, None)
    before = _open_descriptors()
    for group in groups[1:]:
        (result,) = sweep_batch.run_group(job, group, reference, None)
        assert result.error is None
    assert _open_descriptors() == before


def _reports(*, harmed: bool) -> list[Report]:
    """One report of each sweep, clean or with one harmed scenario (or run)."""
    result = _result(PROTECTED, 1, lost=1 if harmed else 0)
    labelled = _report(result)
    violation = Violation(
        kind=Kind.LOST, point=3, where="at crash point 3", image="none", found="f", expected="e"
    )
    disk = PowerLossScenario(
        point=3,
        label="store.saved",
        image="none",
        covers=1,
        loaded="save 1",
        expected="save 1",
        violation=violation if harmed else None,
        result=result,
    )
    power = PowerLossReport(
        job="test",
        config=PROTECTED.name,
        store="journal",
        points=3,
        captured=3,
        pairs=1,
        saves=1,
        captured_labels={"store.saved": 1},
        scenarios=(disk,),
    )
    run = RandomRun(
        run=0,
        store="journal",
        instants=(0.5,),
        kills=1,
        checks_passed=16,
        checks_total=16,
        failed_checks=(),
        duplicates=0,
        lost=1 if harmed else 0,
    )
    random = RandomReport(job="test", seed=0, runs=(run,), plain_seconds=1.0)
    syscalls = SyscallReport(report=labelled, kinds={}, unreachable={}, sample=None)
    return [labelled, syscalls, power, random]


def test_every_sweep_report_follows_the_report_protocol() -> None:
    """The four reports name their job, and a harmed one fails the pytest helper with its
    problems and its text; a clean one passes it; each one's JSON says what its problems say.
    """
    for clean in _reports(harmed=False):
        assert clean.job == "test"
        assert raise_on_problems(clean) is clean
        assert json.loads(json.dumps(clean.to_json())).get("ok", True) is True
    for harmed in _reports(harmed=True):
        problems = harmed.problems()
        assert problems, type(harmed).__name__
        with pytest.raises(AssertionError) as raised:
            raise_on_problems(harmed)
        assert str(raised.value) == "\n".join(problems) + "\n" + harmed.text()
        assert json.loads(json.dumps(harmed.to_json())).get("ok", False) is False
