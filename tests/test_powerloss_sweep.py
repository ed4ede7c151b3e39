"""The power-loss sweep: power cut at crash points of the triage run, then load and resume.

Coverage (task m1, "keys honoured"):

- journal store: every crash point of the run (148: every append's written and
  synced points, the first save's snapshot protocol, every loop point), up to 8
  disks each;
- snapshot store: every third crash point (1, 4, 7, ... of 223), up to 8 disks
  each; a save's 4 points (temp written, temp synced, renamed, dir synced) are
  followed by a varying number of loop points, so the stride falls on each of the
  four save points on some saves (the test checks all four are captured);
- two mutants, every ninth point, up to 4 disks each: a journal whose appends
  skip ``fdatasync``, and a snapshot store that skips the directory sync after
  its rename. Each must show lost durability on some disk.

The whole file takes about 40 s on two cores.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import pytest

from _helpers.mutants import no_datasync
from durably.stores.file import FileStore
from durably.sweep.core import CONFIGS
from durably.sweep.powerloss import MUTANTS, Kind, PowerLossReport, run_power_loss_sweep
from durably.triage.job import TriageJob

KEYS_HONOURED = CONFIGS[0]
JOB = TriageJob("m1-done-after-delete")


def _sweep(store: str | Callable[..., FileStore], every: int, limit: int = 8) -> PowerLossReport:
    return run_power_loss_sweep(
        JOB, config=KEYS_HONOURED, store=store, every=every, limit=limit, jobs=2
    )


def _assert_clean(report: PowerLossReport) -> None:
    totals = report.totals()
    assert report.scenarios, report.text()
    assert not report.problems(), report.text() + "\n".join(report.problems()[:10])
    assert totals["finished"] == totals["scenarios"]
    assert totals["duplicates"] == totals["lost"] == totals["failed_checks"] == 0
    assert totals["violations"] == 0


def test_journal_store_every_point_loads_and_resumes_cleanly() -> None:
    """Every power-cut point of a journal-store run loads a saved state and resumes clean."""
    report = _sweep("journal", every=1)
    _assert_clean(report)
    assert report.captured == report.points
    labels = set(report.captured_labels)
    assert {"store.append.written", "store.append.synced", "store.save.renamed"} <= labels
    # Power cuts mid-save must actually produce disks holding the previous state.
    assert any(s.loaded != "RunNotFound" and s.image for s in report.scenarios)
    assert report.pairs > report.captured  # more than one disk at some points


def test_snapshot_store_every_third_point_loads_and_resumes_cleanly() -> None:
    """Every third power-cut point of a snapshot-store run loads and resumes clean."""
    report = _sweep("snapshot", every=3)
    _assert_clean(report)
    labels = set(report.captured_labels)
    assert {
        "store.save.temp_written",
        "store.save.temp_synced",
        "store.save.renamed",
        "store.save.dir_synced",
    } <= labels


@pytest.mark.parametrize(
    ("store", "mutant"),
    [("journal", no_datasync), (MUTANTS["no-dir-fsync"].store(), nullcontext)],
    ids=["journal without fdatasync", "snapshot without directory sync"],
)
def test_a_store_mutant_is_caught(store: str | Callable[..., FileStore], mutant: object) -> None:
    """A store that skips a sync its protocol needs loses a saved state, and the sweep says so."""
    assert callable(mutant)
    with mutant():
        report = _sweep(store, every=9, limit=4)
    kinds = {v.kind for v in report.violations}
    assert Kind.LOST in kinds, report.text()
    assert report.problems()
