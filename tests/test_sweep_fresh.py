"""Sweep workers as fresh interpreters: same verdicts, really new processes, clean failures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import types
from dataclasses import asdict
from pathlib import Path

import pytest
from typing_extensions import override

from _helpers.patience import stretched
from durably.sweep import CONFIGS, SweepReport, World, _fresh, run_sweep
from test_sweep import RefundJob


class NotingJob(RefundJob):
    """The refund job, noting which process prepared each scenario's world."""

    def __init__(self, notes: Path) -> None:
        self.notes = notes

    @override
    def prepare(self, world: World) -> None:
        super().prepare(world)
        note = {"pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv[:1]}
        with self.notes.open("a") as out:
            out.write(json.dumps(note) + "\n")

    def workers(self) -> list[dict[str, object]]:
        """The notes of worker processes (the caller prepares the recording runs itself)."""
        notes = [json.loads(line) for line in self.notes.read_text().splitlines()]
        return [n for n in notes if n["pid"] != os.getpid()]


def verdicts(report: SweepReport) -> list[dict[str, object]]:
    """The scenarios' verdicts without their error text."""
    return [{k: v for k, v in asdict(r).items() if k != "error"} for r in report.results]


def test_fresh_workers_are_new_interpreters_and_judge_as_forked_ones(tmp_path: Path) -> None:
    """``workers="fresh"`` runs scenarios in interpreters started for it (not copies of the
    caller), and every scenario's verdict is the one forked workers give.
    """
    fresh_job, forked_job = NotingJob(tmp_path / "fresh"), NotingJob(tmp_path / "forked")

    fresh = run_sweep(fresh_job, configs=CONFIGS[1:2], depth=2, jobs=2, workers="fresh")
    forked = run_sweep(forked_job, configs=CONFIGS[1:2], depth=2, jobs=2)

    assert len([r for r in fresh.results if r.depth == 2]) > 10
    assert verdicts(fresh) == verdicts(forked)
    assert fresh.problems() == []
    fresh_workers = {n["pid"] for n in fresh_job.workers()}
    assert len(fresh_workers) == 2
    assert all(n["argv"] == ["-c"] and n["ppid"] == os.getpid() for n in fresh_job.workers())
    assert all(n["argv"] == sys.argv[:1] for n in forked_job.workers())


def test_a_job_that_cannot_be_pickled_is_refused_before_any_work(tmp_path: Path) -> None:
    """A job class defined in a function cannot reach a fresh interpreter: ValueError saying
    why and what to do, raised before the job runs.
    """

    class Local(RefundJob):
        def prepare(self, world: World) -> None:
            raise AssertionError("the sweep started work it should have refused")

    with pytest.raises(ValueError, match=r"cannot be pickled .*use workers='fork'"):
        run_sweep(Local(), configs=CONFIGS[:1], workers="fresh")
    with pytest.raises(ValueError, match="workers is 'fork' or 'fresh', got 'spawn'"):
        run_sweep(Local(), configs=CONFIGS[:1], workers="spawn")  # type: ignore[arg-type]


def test_a_job_the_worker_cannot_import_is_refused_and_no_worker_is_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job that pickles here but names a module only this process has: ValueError naming
    the module, and the workers started for it are stopped.
    """
    module = types.ModuleType("durably_test_module_only_here")

    class Ghost(RefundJob):
        pass

    Ghost.__module__, Ghost.__qualname__ = module.__name__, "Ghost"
    module.Ghost = Ghost  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)

    before = set(_children_running())  # another test's helper process may still be ending
    with pytest.raises(ValueError, match=r"cannot be unpickled .*durably_test_module_only_here"):
        _fresh.start(2, abs, (Ghost(), CONFIGS[0], None))
    assert set(_children_running()) - before == set()


def _double_or_raise(item: int) -> int:
    if item < 0:
        raise LookupError(f"no item {item}")
    return item * 2


def test_outcomes_come_back_and_a_raising_task_raises_in_the_caller() -> None:
    """Every item's outcome comes back once; an exception in a worker is raised here, as it
    is from forked workers.
    """
    before = set(_children_running())  # another test's helper process may still be ending
    workers = _fresh.start(2, _double_or_raise, (RefundJob(), CONFIGS[0], None))
    try:
        assert sorted(workers.imap_unordered(range(20))) == [i * 2 for i in range(20)]
        with pytest.raises(LookupError, match="no item -1"):
            list(workers.imap_unordered([1, -1]))
    finally:
        workers.close()
    assert set(_children_running()) - before == set()


def test_workers_exit_when_their_caller_is_killed(tmp_path: Path) -> None:
    """SIGKILL the caller: its workers see their socket close and exit, none is left behind."""
    script = tmp_path / "caller.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, time
            from durably.sweep import CONFIGS, _fresh
            from durably.triage.job import TriageJob

            workers = _fresh.start(2, abs, (TriageJob(), CONFIGS[0], None))
            print(*workers.pids, flush=True)
            time.sleep(600)
            """
        )
    )
    with subprocess.Popen([sys.executable, script], stdout=subprocess.PIPE, text=True) as caller:
        try:
            assert caller.stdout is not None
            pids = [int(pid) for pid in caller.stdout.readline().split()]
            assert len(pids) == 2
            assert all(_alive(pid) for pid in pids)
        finally:
            caller.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + stretched(20)
    while any(_alive(pid) for pid in pids):
        assert time.monotonic() < deadline, f"workers {pids} outlived their caller"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped has exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _children_running() -> list[int]:
    """This process's children that are still running."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            found.append(int(entry.name))
    return found
