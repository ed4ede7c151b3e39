"""Chained kills judge every second crash as a restart killed alone there does.

The chain (``durably.sweep._chain``) kills one restart at each second crash in
turn, forking a continuation at each point; these tests run real groups both
ways, in real processes, and compare every scenario's verdict field by field.
"""

from __future__ import annotations

import functools
import os
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from _helpers.patience import stretched
from durably import faults
from durably.stores.journal import JournalStore
from durably.sweep import CONFIGS, Config, StoreFactory, _chain, labelled
from durably.sweep import batch as sweep_batch
from durably.sweep.judge import distinct
from durably.sweep.tree import Tree
from durably.triage.job import TriageJob

pytestmark = pytest.mark.skipif(
    not _chain.chaining_possible(), reason="chained kills need a Linux child subreaper"
)


def _groups(
    job: TriageJob, config: Config, store: StoreFactory | None = None
) -> tuple[list[sweep_batch.Group], Counter[str]]:
    labels, prints, reference = labelled.record_points(job, config, store)
    groups = [
        sweep_batch.Group(config, index, labels[index - 1], covers, 2 if config.protected else 1)
        for index, covers in distinct(prints)
    ]
    return groups, reference


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("config", "store"),
    [
        (CONFIGS[0], None),
        (CONFIGS[3], None),
        (CONFIGS[5], None),
        (CONFIGS[0], functools.partial(JournalStore, sync=False)),
    ],
    ids=["keys honoured", "lookups off", "naive retry", "keys honoured, journal store"],
)
def test_chained_and_separate_kills_judge_alike(
    config: Config, store: StoreFactory | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches of groups, their first and second kills chained and not: the same results.

    The chains must really chain (several kills each), or the comparison would
    only compare the separate way with itself.
    """
    job = TriageJob()
    groups, reference = _groups(job, config, store)
    chains: list[tuple[int, int]] = []
    recording: list[_chain.Chain] = []
    real, real_to_end = _chain.chain_kills, _chain.chain_to_end

    def counted(root: Path, points: Any, start: Any) -> list[_chain.ChainedKill]:
        kills = real(root, points, start)
        chains.append((len(points), len(kills)))
        return kills

    def counted_to_end(root: Path, kill_here: Any, start: Any) -> _chain.Chain:
        chain = real_to_end(root, kill_here, start)
        recording.append(chain)
        return chain

    monkeypatch.setattr(_chain, "chain_kills", counted)
    monkeypatch.setattr(_chain, "chain_to_end", counted_to_end)
    for batch in (groups[:4], groups[:: max(1, len(groups) // 5)]):
        chained = sweep_batch.run_batch(job, batch, reference, store)
        separate = sweep_batch.run_batch(
            job, [replace(group, chain=False) for group in batch], reference, store
        )
        assert len(chained) == len(batch)
        assert chained == separate
    assert chains
    assert max(kills for _, kills in chains) > 1
    assert all(kills >= 1 for _, kills in chains)
    if config.protected:  # groups with second crashes: their first restarts killed them
        assert recording
        assert all(chain.status == 0 for chain in recording)
        assert max(len(chain.kills) for chain in recording) > 1


def _starter(body: Any) -> Any:
    """A chain's ``start``: ``await body()`` in a new event loop, under the chain's plan."""

    def start(plan: faults.CrashPlan, prepare: Any) -> None:
        import asyncio

        async def main() -> None:
            prepare()
            with faults.installed(plan):
                await body()

        asyncio.run(main())

    return start


def _chain_in(tmp_path: Path, body: Any, points: list[int]) -> list[_chain.ChainedKill]:
    """Run ``body()`` as a chained process over ``tmp_path``, killed at ``points``."""
    return _chain.chain_kills(tmp_path, points, _starter(body))


def _five_steps(world: Path, pids: Path, *, end: bool = False) -> Any:
    """A body writing ``step1``..``step5`` in ``world``, a point after each, logging its pid."""

    async def body() -> None:
        for step in range(1, 6):
            (world / f"step{step}").write_text(str(step))
            with pids.open("a") as out:
                out.write(f"{os.getpid()}\n")
            faults.point(f"test.step{step}")
        if end:
            (world / "end").write_text("done")

    return body


def test_each_kill_leaves_the_disk_of_its_point_and_kills_the_process_that_wrote_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At each point the copy holds exactly the writes made before it, and the process
    that made them is dead by SIGKILL: the next step is written by another process.
    """
    world, pids = tmp_path / "world", tmp_path / "pids"
    world.mkdir()
    body = _five_steps(world, pids)
    dead_when_copied: list[bool] = []
    read = Tree.read

    def copy(root: Path) -> Tree:
        writer = int(pids.read_text().split()[-1])
        try:
            os.kill(writer, 0)
        except ProcessLookupError:
            dead_when_copied.append(True)
        else:
            dead_when_copied.append(False)
        return read(root)

    monkeypatch.setattr(Tree, "read", copy)
    kills = _chain_in(world, body, [2, 3, 5])
    assert [k.point for k in kills] == [2, 3, 5]
    assert dead_when_copied == [True, True, True]
    for kill in kills:
        assert {e.path for e in kill.disk.entries} == {f"step{n}" for n in range(1, kill.point + 1)}
    # Steps 1-2 by the first process, 3 by its continuation, 4-5 by the next one.
    lines = pids.read_text().split()
    assert len(lines) == 5
    assert lines[0] == lines[1] != lines[2] != lines[3] == lines[4]
    assert lines[0] != lines[3]
    for pid in set(lines):
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)  # killed and reaped: no process, no zombie


def test_a_point_off_the_main_thread_ends_the_chain_after_its_kill(tmp_path: Path) -> None:
    """Where forking is unsafe (a point in a worker thread) the process is killed there
    and no continuation is made: the caller runs the points after it anew.
    """
    import asyncio

    async def body() -> None:
        faults.point("test.one")
        await asyncio.to_thread(faults.point, "test.in-a-thread")
        faults.point("test.three")

    kills = _chain_in(tmp_path, body, [1, 2, 3])
    assert [k.point for k in kills] == [1, 2]


def test_a_process_that_ends_before_its_point_ends_the_chain(tmp_path: Path) -> None:
    """A point the process never reaches gets no copy: the caller runs it alone."""

    async def body() -> None:
        faults.point("test.one")

    assert [k.point for k in _chain_in(tmp_path, body, [1, 4])] == [1]
    assert _chain_in(tmp_path, body, [3]) == []


def test_no_process_of_a_chain_outlives_it(tmp_path: Path) -> None:
    """Killed, or ended, every process is reaped before the call returns; no pipe is left open."""

    async def body() -> None:
        for n in range(4):
            faults.point(f"test.{n}")

    def children() -> set[str]:  # the session's own (a test server) are there before and after
        return set(Path(f"/proc/self/task/{os.getpid()}/children").read_text().split())

    descriptors, before = len(os.listdir("/proc/self/fd")), children()
    _chain_in(tmp_path, body, [1, 2])
    assert len(os.listdir("/proc/self/fd")) == descriptors
    assert children() <= before


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_sweep_command_judges_alike_with_and_without_chains(tmp_path: Path) -> None:
    """``durably sweep --no-chain`` and the default give the same scenarios, one by one."""
    import json
    import subprocess
    import sys

    command = [sys.executable, "-m", "durably", "sweep", "--depth", "2", "--jobs", "2"]
    found = {}
    for name, extra in (("chained", []), ("separate", ["--no-chain"])):
        report = tmp_path / f"{name}.json"
        done = subprocess.run(
            [*command, "--config", "lookups off", "--json", str(report), *extra],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=stretched(500),
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        found[name] = json.loads(report.read_text())
    assert found["chained"]["rows"] == found["separate"]["rows"]
    assert found["chained"]["scenarios"] == found["separate"]["scenarios"]
    assert found["chained"]["rows"][1]["questions"] > 0  # a row with something to hide


def test_a_chain_leaves_the_callers_subreaper_flag_as_it_was(tmp_path: Path) -> None:
    """A caller that is a child subreaper for its own reasons stays one; one that is not, is not."""

    async def body() -> None:
        faults.point("test.one")

    prctl = _chain._prctl()  # noqa: SLF001 -- the test is about the chain's use of prctl
    assert prctl is not None
    try:
        for flag in (1, 0):
            assert prctl(36, flag, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
            _chain_in(tmp_path, body, [1])
            assert _chain._subreaper_flag() == flag  # noqa: SLF001 -- as above
    finally:
        prctl(36, 0, 0, 0, 0)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_chained_second_kill_counts_replies_paid_twice_as_a_separate_one_does() -> None:
    """With the mutant that asks again for a saved reply, depth-2 scenarios pay twice;
    chained and separate second kills count the same, so the chained count is not just 0.
    """
    from _helpers.mutants import installed

    job, config = TriageJob(), CONFIGS[0]
    with installed("saved reply dropped on resume"):
        groups, reference = _groups(job, config)
        batch = groups[:: max(1, len(groups) // 8)]
        chained = sweep_batch.run_batch(job, batch, reference, None)
        separate = sweep_batch.run_batch(
            job, [replace(group, chain=False) for group in batch], reference, None
        )
    second = [r for results in chained for r in results if r.depth == 2]
    assert sum(r.paid_twice for r in second) > 0
    assert chained == separate


def test_a_chain_to_the_end_kills_where_its_process_picks_and_finishes_the_run(
    tmp_path: Path,
) -> None:
    """The process decides at each point, from what it sees there, whether to die; the
    continuation after the last kill runs on to the end, and its exit status is returned.
    """
    world, pids = tmp_path / "world", tmp_path / "pids"
    world.mkdir()
    start = _starter(_five_steps(world, pids, end=True))

    def even_files(point: int, label: str) -> bool:  # asked in the chain's process
        assert label == f"test.step{point}"
        return len(os.listdir(world)) % 2 == 0

    chain = _chain.chain_to_end(world, even_files, start)
    assert [k.point for k in chain.kills] == [2, 4]
    assert chain.status == 0
    assert (world / "end").read_text() == "done"
    for kill in chain.kills:
        assert {e.path for e in kill.disk.entries} == {f"step{n}" for n in range(1, kill.point + 1)}
    lines = pids.read_text().split()
    assert lines[0] == lines[1] != lines[2] == lines[3] != lines[4]


def test_a_chain_to_the_end_that_dies_where_a_fork_is_unsafe_has_no_status(
    tmp_path: Path,
) -> None:
    """A kill off the main thread ends the chain there: nothing ran on, no status."""

    async def body() -> None:
        import asyncio

        faults.point("test.one")
        await asyncio.to_thread(faults.point, "test.in-a-thread")
        faults.point("test.three")

    chain = _chain.chain_to_end(tmp_path, lambda point, _label: point in (1, 2), _starter(body))
    assert [k.point for k in chain.kills] == [1, 2]
    assert chain.status is None


def test_a_chain_to_the_end_reports_how_its_finisher_failed(tmp_path: Path) -> None:
    """A run that raises after the last kill ends the chain with that process's status."""

    async def body() -> None:
        faults.point("test.one")
        raise RuntimeError("the run broke after its kill")

    chain = _chain.chain_to_end(tmp_path, lambda point, _label: point == 1, _starter(body))
    assert [k.point for k in chain.kills] == [1]
    assert chain.status is not None
    assert os.WIFEXITED(chain.status)
    assert os.WEXITSTATUS(chain.status) == 1
