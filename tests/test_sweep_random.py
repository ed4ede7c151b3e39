"""The random sweep: the real demo SIGKILLed at random instants, several times a run."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from _helpers.patience import stretched
from durably.sweep.randomkill import RandomReport, RandomRun, run_random_sweep
from durably.triage.job import TriageDemo
from durably.triage.world import UnknownTask, World


def run(**changes: object) -> RandomRun:
    """A passing random-sweep run, with ``changes`` applied."""
    fields: dict[str, object] = {
        "run": 0,
        "store": "journal",
        "instants": (0.5,),
        "kills": 1,
        "checks_passed": 16,
        "checks_total": 16,
        "failed_checks": (),
        "duplicates": 0,
        "lost": 0,
    }
    fields.update(changes)
    return RandomRun(**fields)  # type: ignore[arg-type]


def test_a_run_is_clean_only_with_every_check_and_nothing_duplicated_or_lost() -> None:
    """A failed check, a duplicate, a loss, an error or no checks at all make a run not clean."""
    assert run().clean
    assert not run(checks_passed=15, failed_checks=("x: y",)).clean
    assert not run(duplicates=1).clean
    assert not run(lost=1).clean
    assert not run(error="boom").clean
    assert not run(checks_passed=0, checks_total=0).clean


def test_a_report_with_no_run_is_a_problem() -> None:
    """An empty random sweep is a failure, never clean."""
    empty = RandomReport(job="t", seed=0, runs=(), plain_seconds=1.0)
    assert empty.problems() == ["the random sweep ran no run"]
    bad = RandomReport(job="t", seed=0, runs=(run(), run(run=1, lost=2)), plain_seconds=1.0)
    assert bad.problems() == ["run 1 (journal, 1 kills): 0 duplicated, 2 lost"]


def test_bad_arguments_are_refused() -> None:
    """Zero runs, zero kills or an unknown store are refused before anything runs."""
    with pytest.raises(ValueError, match="runs and kills"):
        run_random_sweep(TriageDemo(), runs=0)
    with pytest.raises(ValueError, match="stores are chosen from"):
        run_random_sweep(TriageDemo(), runs=1, stores=("sqlite",))


@pytest.mark.slow
def test_twenty_runs_killed_up_to_six_times_each_end_sixteen_of_sixteen() -> None:
    """Seed 0: 20 runs of the demo (both stores in turn), each SIGKILLed at up to 6 random
    instants, each then finished: every run 16/16, nothing duplicated or lost.
    """
    report = run_random_sweep(TriageDemo(), runs=20, kills=6, seed=0, jobs=2)
    assert report.problems() == [], report.text()
    assert len(report.runs) == 20
    assert {r.store for r in report.runs} == {"journal", "snapshot"}
    # Not vacuous: most runs were really killed, several more than once.
    assert sum(r.kills for r in report.runs) >= 30, report.text()
    assert sum(r.kills >= 2 for r in report.runs) >= 8, report.text()


@pytest.mark.slow
def test_the_cli_runs_a_random_sweep_with_any_seed(tmp_path: Path) -> None:
    """``durably sweep --random RUNS --kills K --seed S`` prints one line per run and exits 0
    when every run is clean.
    """
    out = tmp_path / "random.json"
    command = [sys.executable, "-m", "durably", "sweep", "--random", "2", "--kills", "2"]
    command += ["--seed", "7", "--json", str(out)]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=stretched(300), check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2/2 runs clean" in done.stdout
    assert json.loads(out.read_text())["seed"] == 7


def test_the_demo_job_refuses_an_unknown_task_and_reports_no_outcome_before_a_finish(
    tmp_path: Path,
) -> None:
    """``TriageDemo`` names an unknown task at once, and has no outcome for a run not finished."""
    with pytest.raises(UnknownTask, match="no-such-task"):
        TriageDemo("no-such-task")
    demo = TriageDemo()
    assert demo.outcome(tmp_path / "state") is None
    world = World.create(tmp_path / "state" / "worlds" / "r1", "m1-done-after-delete")
    assert demo.outcome(tmp_path / "state") is None  # a world, but no checks written: not done
    (world.root / "checks.json").write_text(json.dumps([{"name": "a", "ok": True, "reason": ""}]))
    outcome = demo.outcome(tmp_path / "state")
    assert outcome is not None
    assert outcome.checks == (("a", True, ""),)
    assert outcome.effects == Counter()
    assert demo.command(tmp_path / "s", "journal")[-4:] == [
        "--store",
        "journal",
        "--state",
        str(tmp_path / "s"),
    ]
