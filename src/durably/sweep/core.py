"""The crash sweep: kill a job at every crash point, restart it, count what went wrong.

For each configuration the sweep

1. runs the job once in a child process, recording every crash point reached
   and a fingerprint of what a crash there would leave behind (the checkpoint,
   the receivers, the model's call log);
2. for each point (depth 1): a fresh world, a child process that SIGKILLs
   itself at that point, then restarts in new child processes until the run
   finishes, then judges the world;
3. at depth 2, for each first crash, crashes again at every point of the first
   restart up to its first saved model reply (the recovery: the resume save,
   the ladder, the interrupted reply's remaining calls);
4. reports per scenario: finished, duplicated effects, lost effects, questions
   asked of a person, saved replies paid for twice, failed checks, and which
   ladder step decided each in-doubt call.
   A scenario the harness could not run as planned carries an error, and a row
   with an errored scenario, or with none, fails the sweep.

Children are forked from warm worker processes (a fork server: no interpreter
start-up per scenario, and whatever the job builds lazily is built once, by a
warm-up run in each worker) and die by a real SIGKILL: no ``finally`` runs, no
lock is released politely. Points whose fingerprint equals the previous point's
leave an identical disk (temp files aside, which every open removes), so a crash
there is the same scenario; the sweep runs it once and counts the points it
covers (``merge=False``, ``durably sweep --no-merge``, kills at every point
instead). The second crashes that follow one first crash share its kill: the
disk the killed process left is kept in memory and laid down again, at the same
path, before each of their restarts.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import tempfile
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol

from .. import faults
from ..approval import ApprovalRequest, Approver, Done, Rerun, ResolveRequest, Yes
from ..models import CallLog
from ..state import Effect, Phase, RunState
from ..stores.file import FileStore
from ..tools import Found, Lookup, Tool, ToolContext
from . import _chain, _output
from .tree import Tree, Uncopyable

__all__ = [
    "CONFIGS",
    "RUN_ID",
    "WINDOW_END",
    "Config",
    "Row",
    "ScenarioResult",
    "ScenarioSpec",
    "StoreFactory",
    "SweepApprover",
    "SweepJob",
    "SweepReport",
    "Workers",
    "World",
    "assert_clean",
    "count_saved_turns",
    "judge_scenario",
    "restart_and_judge",
    "run_in_child",
    "run_scenario_process",
    "run_sweep",
    "scenario_workers",
    "scratch_root",
    "was_killed",
]

StoreFactory = Callable[[Path], FileStore]
"""Builds a scenario's store over its directory."""

RUN_ID = "sweep-run"
MAX_RESTARTS = 6
BATCH = 8
"""Groups (first crashes) a worker takes at a time: their first kills are one chain."""


def scratch_root() -> str | None:
    """Where scenario worlds live: ``/dev/shm`` when writable, else the system's temp directory.

    A RAM-backed file system keeps the sweep's many small writes, renames and
    removals off the disk (on ext4 a rename over a file starts its write-back),
    and a killed process leaves the same files there as anywhere else.
    """
    shm = Path("/dev/shm")  # noqa: S108 - each scenario makes its own private directory in it
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


@dataclass(frozen=True, kw_only=True)
class Config:
    """How the world behaves and how the harness treats in-doubt calls.

    A configuration is a small object: add your own by making one.
    """

    name: str
    honour_keys: bool = True
    """The services deduplicate on idempotency keys."""
    lookups: bool = True
    """Tools keep their lookups (without, an in-doubt write goes to a person)."""
    fickle: bool = False
    """The model answers differently when asked again for a reply it gave."""
    refile_guard: bool = True
    """The tracker refuses a second filing for a cause (without, it shows as a duplicate)."""
    baseline: Literal["naive-retry", "at-most-once"] | None = None
    """A deliberately broken policy that the sweep must show failing."""

    @property
    def protected(self) -> bool:
        """True for configurations durably promises to keep correct."""
        return self.baseline is None

    def adapt(self, tools: Sequence[Tool]) -> list[Tool]:
        """The tools as this configuration's harness declares them."""
        if self.baseline == "naive-retry":
            # No markers worth the name: every unanswered call is simply run again.
            return [replace(t, effect=Effect.IDEMPOTENT, key_ttl=None, lookup=None) for t in tools]
        if self.baseline == "at-most-once":
            # Never run an unanswered effect again: assume it happened.
            return [
                t
                if t.effect is Effect.READ
                else replace(t, effect=Effect.WRITE, key_ttl=None, lookup=_assume_done)
                for t in tools
            ]
        if not self.lookups:
            return [replace(t, lookup=None) if t.effect is Effect.WRITE else t for t in tools]
        return list(tools)


async def _assume_done(ctx: ToolContext, **arguments: object) -> Lookup:
    return Found("assumed done (at-most-once baseline)")


CONFIGS: tuple[Config, ...] = (
    Config(name="keys honoured"),
    Config(name="keys ignored", honour_keys=False),
    Config(name="fickle model", fickle=True),
    Config(name="lookups off", honour_keys=False, lookups=False),
    Config(name="no refile guard", honour_keys=False, refile_guard=False),
    Config(name="naive retry", honour_keys=False, baseline="naive-retry"),
    Config(name="at-most-once", honour_keys=False, baseline="at-most-once"),
)
"""The default configurations: five protected worlds, two baselines.

"lookups off" sends every in-doubt write to a person (ladder step 3); "no refile
guard" takes away the tracker's own refusal of a second filing, which would
otherwise hide a write run twice.
"""


@dataclass(frozen=True, kw_only=True)
class World:
    """One scenario's directory, as the job sees it."""

    root: Path
    config: Config
    store_factory: StoreFactory | None = None
    """Builds the scenario's store over :attr:`store_dir` (default: an unsynced FileStore).
    The power-loss sweep supplies a synced store over a modelled file system here."""

    @property
    def store_dir(self) -> Path:
        """Where the run's checkpoints live."""
        return self.root / "runs"

    @property
    def questions_log(self) -> Path:
        """One line per question asked of a person."""
        return self.root / "questions.jsonl"

    def store(self) -> FileStore:
        """The scenario's store. Syncs are off: the sweep kills processes, not the power.

        The caller closes it (it holds the directory's descriptor); to read once,
        use :meth:`read`.
        """
        if self.store_factory is not None:
            return self.store_factory(self.store_dir)
        return FileStore(self.store_dir, sync=False)

    def read(self) -> RunState:
        """The run's saved state, read through a store that is closed again."""
        store = self.store()
        try:
            return store.read_sync(RUN_ID)
        finally:
            store.close_sync()

    def has_run(self) -> bool:
        """Whether the run was created (its start save returned)."""
        store = self.store()
        try:
            return RUN_ID in store.list_runs_sync()
        finally:
            store.close_sync()


class SweepAgent(Protocol):
    """What the sweep runs: ``durably.Agent``, or a front end's agent with its two calls.

    A Pydantic AI agent with ``Durable`` is wrapped so ``resume`` calls ``Durable.resume``.
    """

    async def run(self, task: str, *, run_id: str) -> object:
        """Start the run ``run_id`` of ``task`` and drive it until it is done or paused."""
        ...

    async def resume(self, run_id: str) -> object:
        """Carry the run on from its last save."""
        ...


class SweepJob(Protocol):
    """What the sweep needs from a job: a world to build, an agent to run, a way to judge."""

    name: str

    def prepare(self, world: World) -> None:
        """Make a fresh world (receivers, workspace) under ``world.root``."""
        ...

    def task(self) -> str:
        """The task the run is started with."""
        ...

    def agent(self, world: World, approver: Approver) -> SweepAgent:
        """The agent for this world, built anew in every process."""
        ...

    def call_log(self, world: World) -> CallLog:
        """The model's call log."""
        ...

    def effects(self, world: World) -> Counter[str]:
        """Every side effect the receivers performed, as a multiset of descriptions."""
        ...

    def oracle(self, world: World, request: ResolveRequest) -> Rerun | Done:
        """What a careful person finds when asked whether an in-doubt call happened."""
        ...

    def checks(self, world: World, state: RunState) -> list[str]:
        """Names (with reasons) of the checks a finished world fails."""
        ...

    def fingerprint(self, world: World) -> str:
        """A digest of everything a crash now would leave behind."""
        ...


class SweepApprover:
    """Approves every call; answers in-doubt questions from the job's oracle, logging each.

    The approver every process of a sweep runs with; a benchmark or a job's own
    test that runs the job as a scenario's process does uses it too.
    """

    def __init__(self, job: SweepJob, world: World) -> None:
        self.job, self.world = job, world

    async def approve(self, request: ApprovalRequest) -> Yes:
        """Yes, always: the sweep judges durability, not a person's choices."""
        return Yes()

    async def resolve(self, request: ResolveRequest) -> Rerun | Done:
        """The job's oracle's answer; the question is logged in the world first."""
        with self.world.questions_log.open("a") as out:
            out.write(json.dumps({"call_id": request.call_id, "tool": request.tool}) + "\n")
        return self.job.oracle(self.world, request)


# -- child processes -----------------------------------------------------------------


def run_in_child(body: Callable[[], None]) -> int:
    """Run ``body`` in a forked child; return its wait status (SIGKILL shows as signalled).

    How every process of a scenario runs: a child of this (warm) process that
    exits with 0, or 1 after printing what ``body`` raised, or dies by a signal.
    """
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        code = 0
        # The run's warnings (a reply lost before its save) are what the sweep
        # provokes on purpose: printed by Python's last-resort handler in each of
        # thousands of children, they would bury the report. They go to the
        # capture file the caller counts, or nowhere (:mod:`._output`); a handler
        # the user configured still receives them (they propagate).
        _output.scenario_logging()
        try:
            body()
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


def run_scenario_process(
    job: SweepJob,
    world: World,
    *,
    first: bool,
    plan: faults.CrashPlan,
    record: Path | None,
    window_only: bool = False,
) -> int:
    """One process of the run: start it or resume it, under a crash plan.

    With ``record``, the labels of every point reached and fingerprints of the
    disk at each are written there; ``window_only`` stops fingerprinting once
    the recovery window (see :func:`_window`) has closed and the disk changed.
    """
    # A crash before the start save returned leaves no run: the next process starts it.
    # Asked here, in the warm parent, where it costs no copied pages: nothing runs
    # between this look and the child's start.
    start = first or not world.has_run()

    def body() -> None:
        recorder = _Recorder(job, world, window_only=window_only)
        if record is not None:
            plan.on_point = recorder.observe
        _run_process(job, world, start=start, plan=plan)
        if record is not None:
            record.write_text(json.dumps(recorder.record(plan)))

    return run_in_child(body)


class _Recorder:
    """What a restart sees at its crash points: their fingerprints, and which are new.

    A fingerprint is taken at every point until the recovery window (see
    :func:`_window`) has closed and the disk has changed after it (with
    ``window_only``; else at every point): the equal points after the window's
    last still count towards its cover.
    """

    def __init__(self, job: SweepJob, world: World, *, window_only: bool, merge: bool = True):
        self._job, self._world, self._window_only, self._merge = job, world, window_only, merge
        self.prints: list[str] = []
        # "open", then "closing" after the window's last point (its equal points
        # after it still count), then "closed" once the disk changes.
        self._window = "open"

    def at_point(self, label: str) -> bool:
        """Fingerprint this point; whether it is a second-crash candidate.

        A candidate is a point inside the recovery window whose fingerprint
        differs from the point before it (every point inside, without
        ``merge``): the points :func:`judge_scenario` chooses from the record.
        """
        if self._window == "closed":
            return False
        digest = self._job.fingerprint(self._world)
        if self._window == "closing":
            if digest != self.prints[-1]:
                self._window = "closed"
                return False
            self.prints.append(digest)
            return False
        new = not self._merge or not self.prints or digest != self.prints[-1]
        self.prints.append(digest)
        if self._window_only and label == WINDOW_END:
            self._window = "closing"
        return new

    def observe(self, label: str) -> None:
        """:meth:`at_point`, as a crash plan's ``on_point``."""
        self.at_point(label)

    def record(self, plan: faults.CrashPlan) -> dict[str, Any]:
        """The labels of every point reached and the fingerprints taken, for the harness."""
        return {"labels": plan.reached, "prints": self.prints}


def _run_process(
    job: SweepJob,
    world: World,
    *,
    start: bool,
    plan: faults.CrashPlan,
    prepare: Callable[[], None] | None = None,
) -> None:
    """The body of every process of a run: start or resume it under ``plan``.

    ``prepare`` runs first inside the process's event loop. The run's final
    state is not the coroutine's result, which ``asyncio.run`` formats (a
    repr of the whole state) when it restores the SIGINT handler.
    """
    agent = job.agent(world, SweepApprover(job, world))

    async def main() -> None:
        if prepare is not None:
            prepare()
        if start:
            await agent.run(job.task(), run_id=RUN_ID)
        else:
            await agent.resume(RUN_ID)

    with faults.installed(plan):
        asyncio.run(main())


def was_killed(status: int) -> bool:
    """Whether a child's wait status says SIGKILL ended it."""
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


# -- scenarios -----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ScenarioResult:
    """What one scenario left behind."""

    config: str
    depth: int
    at: tuple[int, ...]
    """The crash points the scenario died at (1-based indices: first process, first restart)."""
    crashes: tuple[str, ...]
    """The labels of those crash points, in order."""
    covers: int
    """How many crash points this scenario stands for (equal fingerprints)."""
    finished: bool
    duplicates: int
    lost: int
    questions: int
    paid_twice: int
    failed_checks: tuple[str, ...]
    ladder_steps: dict[str, int] = field(default_factory=dict)
    restart_points: tuple[int, ...] = ()
    """Distinct crash points of the first restart (depth-2 candidates), as indices."""
    restart_labels: tuple[str, ...] = ()
    restart_covers: tuple[int, ...] = ()
    error: str | None = None


def _distinct(prints: Sequence[str], merge: bool = True) -> list[tuple[int, int]]:
    """(1-based point index, points covered) for each run of equal fingerprints.

    Without ``merge``, every point stands for itself.
    """
    if not merge:
        return [(index, 1) for index in range(1, len(prints) + 1)]
    chosen: list[tuple[int, int]] = []
    previous = None
    for index, digest in enumerate(prints, 1):
        if digest != previous:
            chosen.append((index, 1))
        else:
            at, covers = chosen[-1]
            chosen[-1] = (at, covers + 1)
        previous = digest
    return chosen


WINDOW_END = "loop.saved.reply"


def _window(labels: Sequence[str]) -> int:
    """How many points of a restart belong to its recovery (up to its first saved reply)."""
    for index, label in enumerate(labels, 1):
        if label == WINDOW_END:
            return index
    return len(labels)


@dataclass(frozen=True)
class ScenarioSpec:
    """One scenario: its configuration, depth, first and second crash points, and labels."""

    config: Config
    depth: int
    first: int
    second: int | None
    labels: tuple[str, ...]
    covers: int
    merge: bool = True


@dataclass(frozen=True)
class _Group:
    """A first crash and, at depth 2, every second crash in the restart that follows it."""

    config: Config
    first: int
    label: str
    covers: int
    depth: int
    merge: bool = True
    chain: bool = True
    """Kills at points of the same run (a batch's first crashes, a group's second ones)
    made by one chain of processes (:mod:`durably.sweep._chain`)."""


def _run_group(
    job: SweepJob,
    group: _Group,
    reference: Counter[str],
    store: StoreFactory | None,
) -> list[ScenarioResult]:
    """One group's scenarios: :func:`_run_batch` of one."""
    (results,) = _run_batch(job, [group], reference, store)
    return results


def _run_batch(
    job: SweepJob,
    groups: Sequence[_Group],
    reference: Counter[str],
    store: StoreFactory | None,
) -> list[list[ScenarioResult]]:
    """Groups of one configuration, in order of first crash, one after another in one world.

    Each group is its first crash's scenario, then each second crash's, all
    from one real first kill: the disk the killed process left is kept in
    memory and laid down again, at the same path, before each second crash's
    restart. A dead process writes nothing more, so that disk is the one a
    fresh world killed at the same point would leave, and re-running the first
    process for every second crash (most of a scenario's cost) proves nothing
    more. With ``chain`` (:mod:`durably.sweep._chain`), the batch's first kills
    are one chain of processes from a fresh world, and each group's second
    kills are made by its first restart as it finds them (:func:`_recording_chain`),
    instead of one process each.
    """
    with tempfile.TemporaryDirectory(prefix="durably-sweep-", dir=scratch_root()) as scratch:
        world = World(root=Path(scratch) / "world", config=groups[0].config, store_factory=store)

        def fresh() -> None:
            if world.root.exists():
                shutil.rmtree(world.root)
            world.root.mkdir()
            job.prepare(world)

        chained: dict[int, Tree] = {}
        if len(groups) > 1 and groups[0].chain:
            chained = _chained_kills(job, world, [g.first for g in groups], fresh, first=True)
        batch = []
        for group in groups:
            left = chained.get(group.first)
            error = None
            if left is None:
                fresh()
                error = _first_process(job, world, group.first)
            else:
                left.write(world.root)
            batch.append(_after_first_kill(job, world, group, left, reference, store, error))
        return batch


def _after_first_kill(
    job: SweepJob,
    world: World,
    group: _Group,
    left: Tree | None,
    reference: Counter[str],
    store: StoreFactory | None,
    error: str | None,
) -> list[ScenarioResult]:
    """A group's scenarios once its first process is dead: ``left`` is its disk, if copied."""
    first = ScenarioSpec(
        group.config, 1, group.first, None, (group.label,), group.covers, group.merge
    )
    if group.depth < 2:
        return [restart_and_judge(job, world, first, reference, error)]
    if left is None:
        with suppress(Uncopyable):  # if it is, each second crash starts from a fresh world
            left = Tree.read(world.root)
    # What every restart after this first crash sees when it begins (the paid-twice
    # count of a chained second kill starts here).
    saved_turns, asked = count_saved_turns(world), len(job.call_log(world).turns(RUN_ID))
    done: ScenarioResult | None = None
    killed: dict[int, Tree] = {}
    if left is not None and group.chain and _chain.chaining_possible():
        done, killed = _recording_chain(job, world, first, reference, error, saved_turns, asked)
        if done is None:
            left.write(world.root)
    if done is None:
        done = restart_and_judge(job, world, first, reference, error)
    results = [done]
    specs = [
        ScenarioSpec(group.config, 2, group.first, point, (group.label, label), covers, group.merge)
        for point, label, covers in zip(
            done.restart_points, done.restart_labels, done.restart_covers, strict=True
        )
    ]
    if left is None:
        return results + [_run_scenario(job, spec, reference, store) for spec in specs]
    disk = left
    if group.chain:
        seconds = [spec.second for spec in specs if spec.second is not None]
        missing = [second for second in seconds if second not in killed]
        killed |= _chained_kills(job, world, missing, lambda: disk.write(world.root), first=False)
    for spec in specs:
        if spec.second in killed:
            killed[spec.second].write(world.root)
            paid_twice = _paid_again(job.call_log(world), asked, saved_turns)
            results.append(
                restart_and_judge(job, world, spec, reference, error, second_killed=paid_twice)
            )
        else:
            left.write(world.root)
            results.append(restart_and_judge(job, world, spec, reference, error))
    return results


def _recording_chain(
    job: SweepJob,
    world: World,
    spec: ScenarioSpec,
    reference: Counter[str],
    error: str | None,
    saved_turns: int,
    asked: int,
) -> tuple[ScenarioResult | None, dict[int, Tree]]:
    """The first restart after a first crash, killed at each second crash it finds on its way.

    The restart that records a group's second crashes and the chain that then
    kills a process at each of them (:func:`_chained_kills`) would run the
    same recovery from the same disk twice. Here one chain does both: its
    process fingerprints each point as the recording restart does, and where
    the point is a new one inside the recovery window it forks its
    continuation and is killed there; past the window the last continuation
    runs on to the end as the uncrashed first restart, and is judged as it
    (``spec``, depth 1). ``saved_turns`` and ``asked`` are what the first
    crash's disk holds.

    Returns:
        That scenario's result, None if the chain ended at a kill (a point
        where a fork was unsafe): the caller restarts the run afresh; and the
        disk left at each kill.
    """
    start = not world.has_run()
    recorder = _Recorder(job, world, window_only=True, merge=spec.merge)
    record_path = world.root / "restart.json"

    def run(plan: faults.CrashPlan, prepare: Callable[[], None]) -> None:
        _output.scenario_logging()
        _run_process(job, world, start=start, plan=plan, prepare=prepare)
        record_path.write_text(json.dumps(recorder.record(plan)))

    try:
        chain = _chain.chain_to_end(world.root, lambda _point, label: recorder.at_point(label), run)
    except Uncopyable:
        return None, {}
    killed = {kill.point: kill.disk for kill in chain.kills}
    if chain.status is None:
        return None, killed
    paid_twice = _paid_again(job.call_log(world), asked, saved_turns)
    record = json.loads(record_path.read_text()) if record_path.exists() else None
    final: RunState | None = None
    finished = False
    if chain.status != 0:
        error = error or f"restart 1 failed (status {chain.status})"
    else:
        final = world.read()
        finished = final.phase is Phase.DONE
    result = judge_scenario(
        job, world, spec, reference, finished, paid_twice, record, error, state=final
    )
    stray = sorted(set(killed) - set(result.restart_points))
    if stray:  # the chain and the record disagree: the sweep fails on this scenario's error
        disagree = f"the chain killed at points the record does not pick: {stray}"
        result = replace(result, error=result.error or disagree)
    return result, killed


def _chained_kills(
    job: SweepJob,
    world: World,
    points: Sequence[int],
    begin: Callable[[], None],
    *,
    first: bool,
) -> dict[int, Tree]:
    """The disk a process leaves when killed at each of ``points``, by chains of kills.

    ``begin`` lays down the disk each chain starts from (a fresh world, or a
    first crash's disk); ``first`` says the chain starts the run rather than
    resumes it. A chain cut short (a point where forking is unsafe) is followed
    by a new one for the points after it; a point no chain reached is left
    out, for the caller to run alone.
    """
    if not _chain.chaining_possible():
        return {}
    disks: dict[int, Tree] = {}
    remaining = list(points)
    while remaining:
        begin()
        start = first or not world.has_run()

        def run(plan: faults.CrashPlan, prepare: Callable[[], None], start: bool = start) -> None:
            _output.scenario_logging()
            _run_process(job, world, start=start, plan=plan, prepare=prepare)

        try:
            kills = _chain.chain_kills(world.root, remaining, run)
        except Uncopyable:
            break  # the points left are run one process each, from a fresh start
        if not kills:
            break
        disks.update((kill.point, kill.disk) for kill in kills)
        remaining = [point for point in remaining if point > kills[-1].point]
    return disks


def _run_scenario(
    job: SweepJob, spec: ScenarioSpec, reference: Counter[str], store: StoreFactory | None
) -> ScenarioResult:
    """One scenario in a fresh world: the first process killed, then the restarts."""
    with tempfile.TemporaryDirectory(prefix="durably-sweep-", dir=scratch_root()) as scratch:
        world = World(root=Path(scratch), config=spec.config, store_factory=store)
        job.prepare(world)
        error = _first_process(job, world, spec.first)
        return restart_and_judge(job, world, spec, reference, error)


def _first_process(job: SweepJob, world: World, point: int) -> str | None:
    """Start the run in a process that SIGKILLs itself at ``point``; the error, if it did not."""
    status = run_scenario_process(
        job, world, first=True, plan=faults.CrashPlan(at=point), record=None
    )
    if not was_killed(status):
        return f"the first process did not die at point {point} (status {status})"
    return None


def restart_and_judge(
    job: SweepJob,
    world: World,
    spec: ScenarioSpec,
    reference: Counter[str],
    error: str | None,
    *,
    record: bool = True,
    second_killed: int | None = None,
) -> ScenarioResult:
    """Restart (dying at ``spec.second`` the first time, if set) until the run ends; judge it.

    With ``record``, an uncrashed first restart records its points (the
    second crashes to come). ``second_killed`` says the restart that dies at
    ``spec.second`` has run already (a chained kill, which left the world as
    it is) and gives the saved replies it paid for again.
    """
    log = job.call_log(world)
    paid_twice = second_killed or 0
    restart_record: dict[str, Any] | None = None
    finished = False
    final: RunState | None = None
    for restart in range(1 if second_killed is None else 2, MAX_RESTARTS + 1):
        saved_turns, asked = count_saved_turns(world), len(log.turns(RUN_ID))
        second = spec.second if restart == 1 else None
        plan = faults.CrashPlan(at=second) if second is not None else faults.CrashPlan()
        recording = record and restart == 1 and second is None
        points = world.root / "restart.json" if recording else None
        status = run_scenario_process(
            job, world, first=False, plan=plan, record=points, window_only=True
        )
        paid_twice += _paid_again(log, asked, saved_turns)
        if points is not None and points.exists():
            restart_record = json.loads(points.read_text())
        if was_killed(status) and second is not None:
            continue
        if status != 0:
            error = error or f"restart {restart} failed (status {status})"
            break
        final = world.read()
        finished = final.phase is Phase.DONE
        break
    return judge_scenario(
        job, world, spec, reference, finished, paid_twice, restart_record, error, state=final
    )


def _paid_again(log: CallLog, asked: int, saved_turns: int) -> int:
    """Replies asked for since the log held ``asked`` whose turn was already saved."""
    return sum(1 for turn in log.turns(RUN_ID)[asked:] if turn <= saved_turns)


def count_saved_turns(world: World) -> int:
    """The turns the world's saved run holds (0 when nothing is saved yet)."""
    try:
        return world.read().turns
    except Exception:  # not created yet: nothing saved
        return 0


def judge_scenario(
    job: SweepJob,
    world: World,
    spec: ScenarioSpec,
    reference: Counter[str],
    finished: bool,
    paid_twice: int,
    restart_record: dict[str, Any] | None,
    error: str | None,
    *,
    state: RunState | None = None,
) -> ScenarioResult:
    """Judge the world a scenario left; ``state``, if given, is its saved state, read already."""
    effects = job.effects(world)
    duplicates = sum(max(0, n - reference[e]) for e, n in effects.items())
    lost = sum(max(0, n - effects[e]) for e, n in reference.items())
    questions = 0
    if world.questions_log.exists():
        questions = len(world.questions_log.read_text().splitlines())
    failed: list[str] = []
    steps: Counter[str] = Counter()
    try:
        state = state if state is not None else world.read()
        failed = job.checks(world, state) if finished else ["run did not finish"]
        steps = Counter(f"step {r.step} {r.outcome}" for r in state.resolutions.values())
    except Exception as exc:
        failed = [f"checkpoint unreadable: {exc}"]
    points: tuple[int, ...] = ()
    labels: tuple[str, ...] = ()
    covers: tuple[int, ...] = ()
    if restart_record is not None:
        window = _window(restart_record["labels"])
        chosen = [(i, c) for i, c in _distinct(restart_record["prints"], spec.merge) if i <= window]
        points = tuple(i for i, _ in chosen)
        covers = tuple(c for _, c in chosen)
        labels = tuple(restart_record["labels"][i - 1] for i in points)
    return ScenarioResult(
        config=spec.config.name,
        depth=spec.depth,
        at=(spec.first,) if spec.second is None else (spec.first, spec.second),
        crashes=spec.labels,
        covers=spec.covers,
        finished=finished,
        duplicates=duplicates,
        lost=lost,
        questions=questions,
        paid_twice=paid_twice,
        failed_checks=tuple(failed),
        ladder_steps=dict(steps),
        restart_points=points,
        restart_labels=labels,
        restart_covers=covers,
        error=error,
    )


def _record_points(
    job: SweepJob, config: Config, store: StoreFactory | None
) -> tuple[list[str], list[str], Counter[str]]:
    """Run the job once without crashing: its crash points, fingerprints and effects."""
    with tempfile.TemporaryDirectory(prefix="durably-sweep-", dir=scratch_root()) as scratch:
        world = World(root=Path(scratch), config=config, store_factory=store)
        job.prepare(world)
        record = world.root / "points.json"
        status = run_scenario_process(
            job, world, first=True, plan=faults.CrashPlan(), record=record
        )
        if status != 0 or not record.exists():
            raise RuntimeError(f"{job.name} under {config.name!r} did not finish without crashes")
        data = json.loads(record.read_text())
        return data["labels"], data["prints"], job.effects(world)


# -- the report ------------------------------------------------------------------------


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


# -- driving -----------------------------------------------------------------------


_pool_task: Callable[[Any], Any] | None = None
"""What a worker does with each item; set before the workers fork, so never pickled."""


def _call_pool_task(item: Any) -> Any:
    if _pool_task is None:  # pragma: no cover - set before the pool forks
        raise RuntimeError("sweep pool used before it was set up")
    return _pool_task(item)


def _warm_up(job: SweepJob, config: Config, store: StoreFactory | None) -> None:
    """Run the job once, without crashing, in this worker: the processes it forks start warm.

    Whatever the job builds lazily (imports, compiled code, schemas, decoded
    recordings) is then in memory before the fork, so no scenario pays for it.
    ``gc.freeze`` keeps the collector from touching, and so copying, every
    inherited page in each child. A failed warm-up only leaves the worker cold:
    a pool initializer that raises makes the pool start workers forever.
    """
    try:
        with tempfile.TemporaryDirectory(prefix="durably-sweep-", dir=scratch_root()) as scratch:
            world = World(root=Path(scratch), config=config, store_factory=store)
            job.prepare(world)
            agent = job.agent(world, SweepApprover(job, world))
            asyncio.run(agent.run(job.task(), run_id=RUN_ID))
    except Exception:
        traceback.print_exc()
    gc.collect()
    gc.freeze()


def _start_worker(job: SweepJob, config: Config, store: StoreFactory | None) -> None:
    """A forked worker's initializer: its signals and stderr (:mod:`._output`), its warm-up."""
    _output.worker_started()
    _warm_up(job, config, store)


def check_jobs(jobs: int) -> None:
    """Refuse a worker count no pool can have, before any work is done."""
    if jobs < 1:
        raise ValueError(f"jobs (worker processes) must be 1 or more, got {jobs}")


Workers = Literal["fork", "fresh"]
"""Where sweep workers come from: forked from the caller, or fresh interpreters."""


@contextmanager
def scenario_workers(
    jobs: int,
    job: SweepJob,
    config: Config,
    task: Callable[[Any], Any],
    store: StoreFactory | None = None,
    workers: Workers = "fork",
) -> Iterator[Callable[[Sequence[Any]], Iterator[Any]]]:
    """``jobs`` warmed-up worker processes doing ``task`` to items, results as they come.

    Workers are forked from this process, or with ``workers="fresh"`` started
    as fresh interpreters (:mod:`durably.sweep._fresh`). Each is warmed up once
    and forks one child per process of a scenario. The warm-up never runs in
    the caller (a user's test process), even for a single job.
    """
    warm_up = (job, config, store)
    if workers == "fresh":
        from . import _fresh

        fresh = _fresh.start(jobs, task, warm_up, prepare=_warm_up)
        try:
            yield fresh.imap_unordered
        finally:
            fresh.close()
        return
    global _pool_task
    _pool_task = task
    context = multiprocessing.get_context("fork")
    with context.Pool(jobs, initializer=_start_worker, initargs=warm_up) as pool:
        yield lambda items: pool.imap_unordered(_call_pool_task, items)


def run_sweep(
    job: SweepJob,
    *,
    configs: Sequence[Config] = CONFIGS,
    depth: int = 1,
    jobs: int = 1,
    progress: Callable[[int, int], None] | None = None,
    store: StoreFactory | None = None,
    workers: Workers = "fork",
    merge: bool = True,
    chain: bool = True,
    on_results: Callable[[Sequence[ScenarioResult]], None] | None = None,
) -> SweepReport:
    """Sweep ``job`` over ``configs`` at depth 1 (and 2); see the module docstring.

    Args:
        job: what to sweep.
        configs: the configurations, each swept separately.
        depth: 1, or 2 for a second crash during the first restart's recovery.
        jobs: worker processes running scenarios in parallel.
        progress: called with (first crashes done, first crashes in all): once
            before the first scenario, then as each batch is judged. The total
            never changes: a first crash is done with all its second crashes,
            which are found only as its restart runs (so scenarios cannot be
            counted ahead; ``on_results`` counts them as they come).
        store: builds each scenario's store over its directory (default: the
            job's ``world.store()`` default, an unsynced ``FileStore``); e.g.
            ``functools.partial(JournalStore, sync=False)``.
        workers: ``"fork"`` (default): workers are forked from this process, so
            the job sees everything the caller set up (a monkeypatch, a fake
            service in memory). ``"fresh"``: workers are new interpreters that
            get the job, configurations and store factory pickled (importable
            classes, not ones defined in a function or in ``__main__``); a
            caller holding much memory, like a test session, sweeps much faster
            so (see :mod:`durably.sweep._fresh`).
        merge: run one scenario per run of points with equal fingerprints (the
            default); False kills at every labelled point, first and second,
            trusting no equivalence (several times slower).
        chain: kill one chain of forked processes at a batch's first crashes,
            and have each group's first restart die at its second crashes as
            it reaches them (the default); False starts a process for each kill
            (slower, judged alike).
        on_results: called with each batch's scenarios as they are judged (to
            count them, or to keep what ran should the sweep be interrupted).
    """
    if depth not in (1, 2):
        raise ValueError("depth is 1 or 2")
    check_jobs(jobs)
    if workers == "fresh":
        from ._fresh import check_picklable

        check_picklable(job, configs, store)
    elif workers != "fork":
        raise ValueError(f"workers is 'fork' or 'fresh', got {workers!r}")
    if not configs:
        raise ValueError("give at least one configuration to sweep")
    references: dict[str, Counter[str]] = {}
    groups: list[_Group] = []
    for config in configs:
        labels, prints, effects = _record_points(job, config, store)
        references[config.name] = effects
        # Baselines already fail at depth 1; a second crash adds nothing to that proof.
        group_depth = depth if config.protected else 1
        for index, covers in _distinct(prints, merge):
            groups.append(
                _Group(config, index, labels[index - 1], covers, group_depth, merge, chain)
            )
    results: list[ScenarioResult] = []
    firsts = 0
    if progress is not None:
        progress(firsts, len(groups))
    batches: list[list[_Group]] = []
    for config in configs:
        mine = [group for group in groups if group.config is config]
        batches += [mine[at : at + BATCH] for at in range(0, len(mine), BATCH)]
    run = functools.partial(_run_batch_of, job, references, store)
    with scenario_workers(jobs, job, configs[0], run, store, workers) as run_all:
        for done in run_all(batches):
            found = [result for _, group_results in done for result in group_results]
            results.extend(found)
            firsts += len(done)
            if on_results is not None:
                on_results(found)
            if progress is not None:
                progress(firsts, len(groups))
    order = {c.name: i for i, c in enumerate(configs)}
    results.sort(key=lambda r: (order[r.config], r.depth, r.at))
    return SweepReport(
        job=job.name,
        results=tuple(results),
        configs=tuple(configs),
        depth=depth,
    )


def _run_batch_of(
    job: SweepJob,
    references: dict[str, Counter[str]],
    store: StoreFactory | None,
    batch: Sequence[_Group],
) -> list[tuple[int, list[ScenarioResult]]]:
    """A worker's task in :func:`run_sweep`: a batch of groups, each with its depth."""
    found = _run_batch(job, batch, references[batch[0].config.name], store)
    return [(group.depth, results) for group, results in zip(batch, found, strict=True)]


def assert_clean(
    job: SweepJob,
    *,
    configs: Sequence[Config] = CONFIGS[:1],
    depth: int = 1,
    jobs: int = 1,
    store: StoreFactory | None = None,
    workers: Workers = "fork",
) -> SweepReport:
    """Sweep ``job`` and fail (``AssertionError`` with the table) on any problem.

    The pytest helper: a user sweeps their own agent in their own suite with
    ``durably.sweep.assert_clean(MyJob(), depth=2)``; the arguments are
    :func:`run_sweep`'s.
    """
    report = run_sweep(job, configs=configs, depth=depth, jobs=jobs, store=store, workers=workers)
    problems = report.problems()
    if problems:
        raise AssertionError("\n".join(problems) + "\n" + report.text())
    return report


def digest_files(paths: Sequence[Path]) -> str:
    """A digest of files' contents (missing files count as empty), for fingerprints."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(str(path).encode())
        try:
            digest.update(path.read_bytes())
        except FileNotFoundError:
            digest.update(b"\0missing")
    return digest.hexdigest()
