"""The system-call sweep: kill a job at every disk-changing system call, not only at labels.

Labelled crash points prove only the instants the code names. This sweep
needs no label: the kernel kills the run at a real system call, chosen by
strace's fault injection (``strace -e inject=SYSCALL:signal=KILL:when=N``).

For each store:

1. **Count.** The job runs once, unkilled, under ``strace -f -y``: every call
   of the swept kinds (:data:`KINDS`) is logged with its thread, its arguments
   (file descriptors shown with their paths) and its result.
2. **Choose kills.** A kill "at write #N" is the kill strace makes when a
   thread enters its N-th ``write``: the process dies before that call runs. An
   ``openat`` is a kill point only when it opens for writing or creates
   (``O_WRONLY``, ``O_RDWR``, ``O_CREAT`` or ``O_TRUNC``); every call of the
   other kinds is one, failed calls included. Kills whose disks are
   necessarily equal are one scenario: two kill points with no call between
   them that changes a file (a write to a file, a create or truncate, a
   successful rename, unlink or mkdir; never an fsync, a write to a pipe, an
   open for reading) leave the same files behind (a killed process writes
   nothing more), so the sweep kills at the first and counts the others in
   its ``points`` column, as the labelled sweep does with equal fingerprints.
3. **Kill, restart, judge.** In a fresh world the job is started under
   ``strace -e inject=KIND:signal=KILL:when=N``; the process must die by
   SIGKILL. It is restarted (unkilled) until the run finishes, and judged with
   the engine every sweep shares (:func:`durably.sweep.engine.restart_and_judge`):
   duplicates and losses at the receivers, replies paid twice, questions, the
   job's checks.
4. **Depth 2.** The first restart after each first kill is itself counted
   under strace, up to its first saved model reply (the recovery window, marked
   in the log by a ``statfs`` of :data:`WINDOW_MARK` that the child makes at the
   ``loop.saved.reply`` crash point). Every kill point of that window is then
   a second kill: the disk the first kill left is laid down again, the restart
   is killed there, and restarts follow until the run finishes.

What N means, exactly: strace keeps the injection counter **per tracee** (per
thread and per process, each counting its own calls of that system call from
1 once traced). With ``-f`` the kill falls on whichever tracee first makes its
N-th call of the kind. So that every call of the run is reachable, the child
runs the store's blocking calls on the event loop's own thread (an inline
default executor): the run then makes all its calls from one thread, and N is
simply the N-th call of that kind the run's process makes. Calls that a thread
or child process of the job's own makes are swept too, but a call is reachable
only if no other tracee made N calls of its kind before it; the counting run
reports how many were not (``unreachable``; 0 for the reference job).

Each scenario is a real process: forked from a warm worker (no interpreter
start-up), traced by a new strace attached to it before it makes any call
(the child waits until ``/proc/self/status`` shows its tracer), and killed by
the kernel. Scenarios run in parallel worker processes.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import faults
from .config import Config
from .engine import NOT_KILLED, restart_and_judge
from .job import SweepJob
from .judge import ScenarioResult, ScenarioSpec, judge_scenario
from .pool import check_jobs, scenario_workers
from .process import run_scenario_process, was_killed
from .report import SweepReport, SyscallReport, raise_on_problems
from .strace import KINDS, WINDOW_MARK, Call, Strace, Trace, parse_trace, plan_kills
from .tree import Tree, Uncopyable
from .world import StoreFactory, World
from .world import scratch_root as default_scratch_root

__all__ = [
    "KINDS",
    "WINDOW_MARK",
    "Call",
    "SyscallReport",
    "assert_syscalls_clean",
    "parse_trace",
    "run_syscall_sweep",
]

_ATTEMPTS = 3


# -- scenarios -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Group:
    store: str
    kind: str
    index: int
    covers: int
    depth: int


@dataclass
class _Outcome:
    results: list[ScenarioResult] = field(default_factory=list)
    kinds: Counter[tuple[str, int, str, str]] = field(default_factory=Counter)
    """(store, depth, kind, "points" or "kills") -> count."""
    unreachable: int = 0


def _label(kind: str, index: int) -> str:
    return f"{kind}#{index}"


def _run_group(
    job: SweepJob, group: _Group, reference: Counter[str], settings: _Settings
) -> _Outcome:
    """One first kill, its scenario, and (depth 2) every second kill of its first restart."""
    outcome = _Outcome()
    config = Config(name=group.store)
    first = ScenarioSpec(
        config, 1, group.index, None, (_label(group.kind, group.index),), group.covers
    )
    with tempfile.TemporaryDirectory(
        prefix="durably-syscalls-", dir=settings.scratch_root
    ) as scratch:
        world = World(root=Path(scratch) / "world", config=config, store_factory=settings.store)
        kill = Strace(kind=group.kind)
        for _attempt in range(_ATTEMPTS):
            # A run's calls can differ a little from the counting run's (a timestamp
            # one digit shorter can move a compaction): an unkilled run is tried again.
            if world.root.exists():
                shutil.rmtree(world.root)
            world.root.mkdir()
            job.prepare(world)
            status = kill.process(job, world, first=True, at=group.index, record=None)
            if was_killed(status):
                break
        error = None
        if not was_killed(status):
            error = f"the first process was not killed at {first.labels[0]} (status {status})"
        if group.depth < 2:
            outcome.results.append(
                restart_and_judge(job, world, first, reference, error, record=False)
            )
            return outcome
        try:
            left: Tree | None = Tree.read(world.root)
        except Uncopyable:
            left = None
        log = Path(scratch) / "restart.trace"
        outcome.results.append(
            restart_and_judge(
                job, world, first, reference, error, record=False, kill=Strace(log=log)
            )
        )
        if left is None or not log.exists():
            return outcome
        groups, unreachable = parse_trace(log.read_text()).kills(window=True)
        outcome.unreachable += unreachable
        heads = plan_kills(
            groups,
            sample=settings.sample,
            merge=settings.merge,
            kinds=outcome.kinds,
            store=group.store,
            depth=2,
        )
        for head, calls in heads:
            spec = ScenarioSpec(
                config,
                2,
                group.index,
                head.index,
                (first.labels[0], _label(head.kind, head.index)),
                len(calls),
            )
            for _attempt in range(_ATTEMPTS):
                # As for first kills: a restart whose calls moved a little from the
                # counted restart's is not killed; lay the disk down and try again.
                left.write(world.root)
                result = restart_and_judge(
                    job, world, spec, reference, error, record=False, kill=Strace(kind=head.kind)
                )
                if not (result.error or "").startswith(NOT_KILLED):
                    break
            outcome.results.append(result)
    return outcome


# -- driving -----------------------------------------------------------------------


def strace_available() -> bool:
    """True when ``strace`` is on the PATH."""
    return shutil.which("strace") is not None


def _count(
    job: SweepJob, store_name: str, store: StoreFactory, scratch_root: str | None
) -> tuple[Trace, Counter[str]]:
    """The counting run: the job once, unkilled, under strace; its trace and its effects."""
    config = Config(name=store_name)
    with tempfile.TemporaryDirectory(prefix="durably-syscalls-", dir=scratch_root) as scratch:
        world = World(root=Path(scratch) / "world", config=config, store_factory=store)
        world.root.mkdir()
        job.prepare(world)
        log = Path(scratch) / "count.trace"
        status = Strace(log=log).process(job, world, first=True, at=None, record=None)
        if status != 0:
            raise RuntimeError(f"{job.name} on the {store_name} store did not finish unkilled")
        return parse_trace(log.read_text()), job.effects(world)


def run_syscall_sweep(  # noqa: PLR0913 - the sweep's public options, keyword-only with defaults
    job: SweepJob,
    stores: dict[str, StoreFactory],
    *,
    depth: int = 1,
    jobs: int = 1,
    sample: int | None = None,
    merge: bool = True,
    progress: Callable[[int, int], None] | None = None,
    scratch: str | None = None,
    stage: Callable[[str], None] | None = None,
    on_results: Callable[[Sequence[ScenarioResult]], None] | None = None,
) -> SyscallReport:
    """Kill ``job`` at every disk-changing system call, per store; see the module docstring.

    Args:
        job: what to sweep (its ``agent`` should honour the store factory's syncs).
        stores: name -> store factory, e.g. ``{"snapshot": partial(FileStore, sync=True)}``.
        depth: 1, or 2 to also kill at every call of the first restart's recovery.
        jobs: worker processes running scenarios in parallel.
        sample: at most this many kills per call kind (first kills, and second kills
            per first kill), spread evenly; None kills at every one.
        merge: kill once for kill points that leave equal disks (the default); False
            kills at every point.
        progress: called with (first kills done, first kills in all).
        scratch: where scenario worlds live (default: ``/dev/shm`` when writable).
        stage: called with what the sweep starts doing next (a store's counting
            run, its kills), for a person watching.
        on_results: called with each first kill's scenarios as they are judged.
    """
    if depth not in (1, 2):
        raise ValueError("depth is 1 or 2")
    check_jobs(jobs)
    if not stores:
        raise ValueError("give at least one store to sweep")
    if not strace_available():
        raise RuntimeError("the system-call sweep needs strace (apt-get install strace)")
    scratch_root = scratch if scratch is not None else default_scratch_root()
    results: list[ScenarioResult] = []
    kinds: Counter[tuple[str, int, str, str]] = Counter()
    unreachable: dict[str, int] = {}
    done = 0
    for name, store in stores.items():
        settings = _Settings(name, store, scratch_root, sample, merge)
        task = functools.partial(_pool_item, job, settings)
        with scenario_workers(jobs, job, Config(name=name), task, store) as run_all:
            # Counted in a warm worker, like every scenario: a cold process makes
            # calls (lazy imports, caches) that a warm one never makes.
            if stage is not None:
                stage(f"{name}: counting calls")
            ((trace, reference),) = list(run_all([None]))
            groups, unreachable[name] = trace.kills()
            planned = [
                (_Group(name, head.kind, head.index, len(calls), depth), reference)
                for head, calls in plan_kills(
                    groups, sample=sample, merge=merge, kinds=kinds, store=name, depth=1
                )
            ]
            total = done + len(planned)
            if stage is not None:
                stage(f"{name}: first kills")
            if progress is not None:
                progress(done, total)
            for outcome in run_all(planned):
                results.extend(outcome.results)
                if on_results is not None:
                    on_results(outcome.results)
                kinds.update(outcome.kinds)
                unreachable[name] += outcome.unreachable
                done += 1
                if progress is not None:
                    progress(done, total)
    order = {name: i for i, name in enumerate(stores)}
    results.sort(key=lambda r: (order[r.config], r.depth, r.crashes))
    report = SweepReport(
        job=job.name,
        results=tuple(results),
        configs=tuple(Config(name=name) for name in stores),
        depth=depth,
    )
    table = {
        (name, d, kind): (kinds[(name, d, kind, "points")], kinds[(name, d, kind, "kills")])
        for (name, d, kind, _) in kinds
    }
    return SyscallReport(report=report, kinds=table, unreachable=unreachable, sample=sample)


@dataclass(frozen=True)
class _Settings:
    store_name: str
    store: StoreFactory
    scratch_root: str | None
    sample: int | None
    merge: bool


_settled: set[tuple[int, str]] = set()


def _settle(job: SweepJob, settings: _Settings) -> None:
    """Bring this worker to the state every later scenario forks from, once per store.

    Judging a scenario leaves state in the worker that its next children
    inherit (a cached mount table entry for the scratch directory's device,
    modules the checks imported), and a child that inherits it makes fewer
    calls. One whole unkilled scenario, judged, before the counting run and
    before any kill makes every child of this worker start from the same state,
    so the counting run's N-th call is every killed run's N-th call.
    """
    key = (os.getpid(), settings.store_name)
    if key in _settled:
        return
    _settled.add(key)
    config = Config(name=settings.store_name)
    with tempfile.TemporaryDirectory(
        prefix="durably-syscalls-", dir=settings.scratch_root
    ) as scratch:
        world = World(root=Path(scratch) / "world", config=config, store_factory=settings.store)
        world.root.mkdir()
        job.prepare(world)
        run_scenario_process(job, world, first=True, plan=faults.CrashPlan(), record=None)
        spec = ScenarioSpec(config, 1, 0, None, (), 1)
        judge_scenario(job, world, spec, Counter(), True, 0, None, None)


def _pool_item(job: SweepJob, settings: _Settings, item: tuple[_Group, Counter[str]] | None) -> Any:
    """A worker's task: the counting run (``None``), or one first kill and its second kills."""
    _settle(job, settings)
    if item is None:
        return _count(job, settings.store_name, settings.store, settings.scratch_root)
    group, reference = item
    return _run_group(job, group, reference, settings)


def assert_syscalls_clean(
    job: SweepJob,
    stores: dict[str, StoreFactory],
    *,
    depth: int = 1,
    jobs: int = 1,
    sample: int | None = None,
) -> SyscallReport:
    """The pytest helper: sweep and fail (``AssertionError`` with the table) on any problem."""
    report = run_syscall_sweep(job, stores, depth=depth, jobs=jobs, sample=sample)
    return raise_on_problems(report, most=10)


def triage_stores() -> dict[str, StoreFactory]:
    """Both file stores, synced as the triage command runs them."""
    from ..stores.file import FileStore
    from ..stores.journal import JournalStore

    return {
        "snapshot": functools.partial(FileStore, sync=True),
        "journal": functools.partial(JournalStore, sync=True),
    }


def dumps(report: SyscallReport) -> str:
    """The report as indented JSON."""
    return json.dumps(report.to_json(), indent=2) + "\n"
