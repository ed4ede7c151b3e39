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
   the labelled sweep's own judging (:func:`durably.sweep.core.judge_scenario`):
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

import asyncio
import concurrent.futures
import contextlib
import ctypes
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import faults
from ..state import Phase
from . import _output, core
from .core import RUN_ID, Config, ScenarioResult, StoreFactory, SweepJob, SweepReport, World
from .tree import Tree, Uncopyable

__all__ = [
    "KINDS",
    "WINDOW_MARK",
    "SyscallReport",
    "assert_syscalls_clean",
    "run_syscall_sweep",
]

KINDS: tuple[str, ...] = (
    "openat",
    "write",
    "pwrite64",
    "fsync",
    "fdatasync",
    "rename",
    "renameat",
    "renameat2",
    "unlink",
    "unlinkat",
    "mkdir",
    "mkdirat",
    "ftruncate",
)
"""The disk-changing system calls the sweep kills at."""

WINDOW_MARK = "/durably-sweep-window-end"
"""The path the child ``statfs``-es when its first model reply is saved (depth 2's window)."""

_MARK_CALL = "statfs"
_WRITING = re.compile(r"O_WRONLY|O_RDWR|O_CREAT|O_TRUNC")
_CHANGES_NAMES = frozenset(
    {"rename", "renameat", "renameat2", "unlink", "unlinkat", "mkdir", "mkdirat"}
)
_WRITES_DATA = frozenset({"write", "pwrite64", "ftruncate"})
_LINE = re.compile(r"^(\d+)\s+(\w+)\((.*)$")
_RESULT = re.compile(r"\)\s+=\s+(-?\d+|\?)(?:\s.*)?$")
_NOT_A_FILE = re.compile(r"/dev/(null|zero|full|tty|pts/|u?random)")
_FD_PATH = re.compile(r"^-?\d+<([^>]*)>")
_TRACER_WAIT = 30.0
_ATTEMPTS = 3
_NOT_KILLED = "the restart was not killed"


@dataclass(frozen=True, slots=True)
class Call:
    """One system call in a strace log."""

    position: int
    """Its place among the logged calls (0-based)."""
    tid: int
    kind: str
    index: int
    """Which call of its kind it is in its thread (1-based): strace's ``when=`` number."""
    changes_files: bool
    """It may change what is on disk (see the module docstring)."""
    kill_point: bool
    text: str


@dataclass(frozen=True, slots=True)
class Trace:
    """A counted run: its calls and where the recovery window closed."""

    calls: tuple[Call, ...]
    window_end: int | None
    """Position of the window mark (None when the run never saved a reply)."""

    def kills(self, *, window: bool = False) -> tuple[list[list[Call]], int]:
        """The kill points, in groups that leave equal disks; and how many were unreachable.

        Each group's first call is the one strace's ``when=`` reaches: the first,
        in the log's order, that is the ``index``-th of its kind in its thread.
        """
        end = self.window_end if window and self.window_end is not None else len(self.calls)
        first_of: dict[tuple[str, int], int] = {}
        for call in self.calls:
            first_of.setdefault((call.kind, call.index), call.position)
        groups: dict[int, list[Call]] = {}
        unreachable = 0
        changes = 0
        for call in self.calls:
            if call.position >= end:
                break
            if call.kill_point:
                if first_of[(call.kind, call.index)] != call.position:
                    unreachable += 1
                else:
                    groups.setdefault(changes, []).append(call)
            if call.changes_files:
                changes += 1
        return list(groups.values()), unreachable


def parse_trace(text: str) -> Trace:
    """Read an ``strace -f -y`` log of the swept kinds (and the window mark)."""
    calls: list[Call] = []
    counts: Counter[tuple[int, str]] = Counter()
    window_end: int | None = None
    for line in text.splitlines():
        if "resumed>" in line:
            continue
        match = _LINE.match(line)
        if match is None:
            continue
        tid, kind, rest = int(match.group(1)), match.group(2), match.group(3)
        if kind == _MARK_CALL:
            if WINDOW_MARK in rest and window_end is None:
                window_end = len(calls)
            continue
        if kind not in KINDS:
            continue
        counts[(tid, kind)] += 1
        finished = _RESULT.search(rest)
        result = finished.group(1) if finished else "?"
        ok = result not in ("?",) and not result.startswith("-")
        if kind == "openat":
            kill_point = _WRITING.search(rest) is not None
            creates = "O_CREAT" in rest or "O_TRUNC" in rest
            changes = kill_point and creates and (ok or result == "?")
        elif kind in _WRITES_DATA:
            kill_point = True
            path = _FD_PATH.match(rest)
            target = path.group(1) if path else ""
            # Unknown target (no path shown): assume a file.
            changes = path is None or (target.startswith("/") and _NOT_A_FILE.match(target) is None)
        elif kind in _CHANGES_NAMES:
            kill_point = True
            changes = ok or result == "?"
        else:  # fsync, fdatasync: nothing a killed process leaves differs
            kill_point = True
            changes = False
        calls.append(
            Call(
                position=len(calls),
                tid=tid,
                kind=kind,
                index=counts[(tid, kind)],
                changes_files=changes,
                kill_point=kill_point,
                text=line[:200],
            )
        )
    return Trace(calls=tuple(calls), window_end=window_end)


# -- one traced process ------------------------------------------------------------


class _InlineExecutor(ThreadPoolExecutor):
    """A default executor that runs each task at once, on the calling thread.

    ``asyncio.to_thread`` (the stores' synced I/O) then makes its system calls
    on the loop's thread, so strace's per-thread counter counts every call of
    the run (see the module docstring).
    """

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)
        return future


def _allow_any_tracer() -> None:
    """Let a non-ancestor strace attach (Yama's ptrace_scope 1 forbids it otherwise)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(0x59616D61, ctypes.c_ulong(-1 & 0xFFFFFFFFFFFFFFFF), 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - no prctl: attaching may still work
        pass


def _tracer_attached(pid: int) -> bool:
    """True once ``pid`` has a tracer (read by the parent: its calls are not traced)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            found = re.search(rb"TracerPid:\s+(\d+)", status.read())
    except OSError:
        return False
    return found is not None and int(found.group(1)) != 0


def _mark_window(label: str) -> None:
    if label == core.WINDOW_END:
        with contextlib.suppress(OSError):
            os.statvfs(WINDOW_MARK)


def _traced(job: SweepJob, world: World, *, first: bool, strace: Sequence[str]) -> int:
    """Run (or resume) the job in a forked child under strace; return its wait status.

    The child blocks in a ``read`` of a pipe (not a swept call) until the parent
    has seen strace attached to it, so the trace starts at the same call in
    every run: the counting run's N-th call is the killed run's N-th call.
    """
    ready, go = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        code = 0
        try:
            os.close(go)
            _allow_any_tracer()
            if os.read(ready, 1) != b"1":
                raise RuntimeError("strace never attached")
            os.close(ready)
            _output.scenario_logging(drop=False)
            agent = job.agent(world, core.SweepApprover(job, world))
            start = first or RUN_ID not in world.store().list_runs_sync()

            async def main() -> None:
                asyncio.get_running_loop().set_default_executor(_InlineExecutor(1))
                if start:
                    await agent.run(job.task(), run_id=RUN_ID)
                else:
                    await agent.resume(RUN_ID)

            with faults.installed(faults.CrashPlan(on_point=_mark_window)):
                asyncio.run(main())
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    os.close(ready)
    command = ["strace", "-f", "-qq", "-p", str(pid), *strace]
    tracer: subprocess.Popen[bytes] | None = None
    try:
        tracer = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + _TRACER_WAIT
        while not _tracer_attached(pid):
            if tracer.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "strace could not attach: "
                    + (tracer.communicate()[1] or b"").decode(errors="replace").strip()
                )
            time.sleep(0.0005)
        os.write(go, b"1")
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        if tracer is not None:
            tracer.kill()
            tracer.wait()
        raise
    finally:
        os.close(go)
    _, status = os.waitpid(pid, 0)
    try:
        tracer.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        tracer.kill()
        tracer.communicate()
    return status


def _trace_args(log: Path | None, inject: tuple[str, int] | None) -> list[str]:
    kinds = ",".join((*KINDS, _MARK_CALL))
    args = ["-e", f"trace={kinds}", "-o", str(log) if log is not None else "/dev/null"]
    if log is not None:
        args.append("-y")
    if inject is not None:
        kind, n = inject
        args += ["-e", f"inject={kind}:signal=KILL:when={n}"]
    return args


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


def _restarts(
    job: SweepJob,
    world: World,
    *,
    traced_first: Sequence[str] | None,
    expect_kill: bool,
) -> tuple[bool, int, str | None, int]:
    """Restart until the run ends: (finished, replies paid twice, error, first status).

    The first restart runs under strace with ``traced_first`` when given.
    """
    log = job.call_log(world)
    paid_twice = 0
    error: str | None = None
    first_status = -1
    for restart in range(1, core.MAX_RESTARTS + 1):
        saved_turns, asked = core.count_saved_turns(world), len(log.turns(RUN_ID))
        if restart == 1 and traced_first is not None:
            status = _traced(job, world, first=False, strace=traced_first)
        else:
            status = core.run_scenario_process(
                job, world, first=False, plan=faults.CrashPlan(), record=None
            )
        if restart == 1:
            first_status = status
        paid_twice += sum(1 for t in log.turns(RUN_ID)[asked:] if t <= saved_turns)
        if restart == 1 and expect_kill:
            if core.was_killed(status):
                continue
            error = f"{_NOT_KILLED} where planned (status {status})"
        if status != 0:
            error = error or f"restart {restart} failed (status {status})"
            break
        state = world.store().read_sync(RUN_ID)
        return state.phase is Phase.DONE, paid_twice, error, first_status
    return False, paid_twice, error or "the run did not finish", first_status


def _scenario(
    job: SweepJob,
    world: World,
    spec: core.ScenarioSpec,
    reference: Counter[str],
    *,
    error: str | None,
    traced_first: Sequence[str] | None = None,
    expect_kill: bool = False,
) -> ScenarioResult:
    finished, paid_twice, restart_error, _ = _restarts(
        job, world, traced_first=traced_first, expect_kill=expect_kill
    )
    return core.judge_scenario(
        job, world, spec, reference, finished, paid_twice, None, error or restart_error
    )


def _run_group(
    job: SweepJob, group: _Group, reference: Counter[str], settings: _Settings
) -> _Outcome:
    """One first kill, its scenario, and (depth 2) every second kill of its first restart."""
    outcome = _Outcome()
    config = Config(name=group.store)
    first = core.ScenarioSpec(
        config, 1, group.index, None, (_label(group.kind, group.index),), group.covers
    )
    with tempfile.TemporaryDirectory(
        prefix="durably-syscalls-", dir=settings.scratch_root
    ) as scratch:
        world = World(root=Path(scratch) / "world", config=config, store_factory=settings.store)
        inject = _trace_args(None, (group.kind, group.index))
        for _attempt in range(_ATTEMPTS):
            # A run's calls can differ a little from the counting run's (a timestamp
            # one digit shorter can move a compaction): an unkilled run is tried again.
            if world.root.exists():
                shutil.rmtree(world.root)
            world.root.mkdir()
            job.prepare(world)
            status = _traced(job, world, first=True, strace=inject)
            if core.was_killed(status):
                break
        error = None
        if not core.was_killed(status):
            error = f"the first process was not killed at {first.labels[0]} (status {status})"
        if group.depth < 2:
            outcome.results.append(_scenario(job, world, first, reference, error=error))
            return outcome
        try:
            left: Tree | None = Tree.read(world.root)
        except Uncopyable:
            left = None
        log = Path(scratch) / "restart.trace"
        outcome.results.append(
            _scenario(
                job, world, first, reference, error=error, traced_first=_trace_args(log, None)
            )
        )
        if left is None or not log.exists():
            return outcome
        groups, unreachable = parse_trace(log.read_text()).kills(window=True)
        outcome.unreachable += unreachable
        heads = _plan(
            groups,
            sample=settings.sample,
            merge=settings.merge,
            kinds=outcome.kinds,
            store=group.store,
            depth=2,
        )
        for head, calls in heads:
            spec = core.ScenarioSpec(
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
                result = _scenario(
                    job,
                    world,
                    spec,
                    reference,
                    error=error,
                    traced_first=_trace_args(None, (head.kind, head.index)),
                    expect_kill=True,
                )
                if not (result.error or "").startswith(_NOT_KILLED):
                    break
            outcome.results.append(result)
    return outcome


def _plan(
    groups: list[list[Call]],
    *,
    sample: int | None,
    merge: bool,
    kinds: Counter[tuple[str, int, str, str]],
    store: str,
    depth: int,
) -> list[tuple[Call, list[Call]]]:
    """The kills to make: (the call killed at, the kill points it stands for).

    Every group when ``sample`` is None (see :func:`_heads`). With a sample, for
    each call kind at most ``sample`` groups holding a call of that kind,
    spread evenly over the run, each killed at its first call of that kind:
    every kind the run makes gets real kills.
    """
    if sample is None:
        return _heads(groups, merge, kinds, store, depth)
    chosen: list[tuple[Call, list[Call]]] = []
    counted: set[int] = set()
    for kind in KINDS:
        holding = [g for g in groups if any(c.kind == kind for c in g)]
        if not holding:
            continue
        step = (len(holding) - 1) / max(1, sample - 1)
        picks = sorted({round(k * step) for k in range(min(sample, len(holding)))})
        for pick in picks:
            calls = holding[pick]
            head = next(c for c in calls if c.kind == kind)
            if id(calls) not in counted:
                counted.add(id(calls))
                for call in calls:
                    kinds[(store, depth, call.kind, "points")] += 1
            kinds[(store, depth, kind, "kills")] += 1
            chosen.append((head, calls if merge else [head]))
    return chosen


# -- the report ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SyscallReport:
    """The sweep's table (rows per store and depth) and the kills per call kind."""

    report: SweepReport
    kinds: dict[tuple[str, int, str], tuple[int, int]]
    """(store, depth, kind) -> (kill points, real kills)."""
    unreachable: dict[str, int]
    """Per store: kill points strace's per-thread counter could not reach."""
    sample: int | None

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
        status = _traced(job, world, first=True, strace=_trace_args(log, None))
        if status != 0:
            raise RuntimeError(f"{job.name} on the {store_name} store did not finish unkilled")
        return parse_trace(log.read_text()), job.effects(world)


def run_syscall_sweep(
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
    core.check_jobs(jobs)
    if not stores:
        raise ValueError("give at least one store to sweep")
    if not strace_available():
        raise RuntimeError("the system-call sweep needs strace (apt-get install strace)")
    scratch_root = scratch if scratch is not None else core.scratch_root()
    results: list[ScenarioResult] = []
    kinds: Counter[tuple[str, int, str, str]] = Counter()
    unreachable: dict[str, int] = {}
    done = 0
    for name, store in stores.items():
        settings = _Settings(name, store, scratch_root, sample, merge)
        task = functools.partial(_pool_item, job, settings)
        with core.scenario_workers(jobs, job, Config(name=name), task, store) as run_all:
            # Counted in a warm worker, like every scenario: a cold process makes
            # calls (lazy imports, caches) that a warm one never makes.
            if stage is not None:
                stage(f"{name}: counting calls")
            ((trace, reference),) = list(run_all([None]))
            groups, unreachable[name] = trace.kills()
            planned = [
                (_Group(name, head.kind, head.index, len(calls), depth), reference)
                for head, calls in _plan(
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


def _heads(
    groups: list[list[Call]],
    merge: bool,
    kinds: Counter[tuple[str, int, str, str]],
    store: str,
    depth: int,
) -> list[tuple[Call, list[Call]]]:
    """The call to kill at for each group, counting points and kills per kind in ``kinds``.

    Within a group (equal disks) the kill goes to the call whose kind has been
    killed least so far, so every kind gets real kills, not only the first of
    each group (an fsync before a rename would otherwise stand for every rename).
    """
    chosen: list[tuple[Call, list[Call]]] = []
    for group in groups:
        for calls in [group] if merge else [[call] for call in group]:
            head = min(calls, key=lambda c: (kinds[(store, depth, c.kind, "kills")], c.position))
            for call in calls:
                kinds[(store, depth, call.kind, "points")] += 1
            kinds[(store, depth, head.kind, "kills")] += 1
            chosen.append((head, calls))
    return chosen


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
        core.run_scenario_process(job, world, first=True, plan=faults.CrashPlan(), record=None)
        spec = core.ScenarioSpec(config, 1, 0, None, (), 1)
        core.judge_scenario(job, world, spec, Counter(), True, 0, None, None)


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
    problems = report.problems()
    if problems:
        raise AssertionError("\n".join(problems[:10]) + "\n" + report.text())
    return report


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
