"""The system-call kill method: strace kills a process as it enters its N-th call of a kind.

What the system-call sweep (:mod:`durably.sweep.syscalls`) kills with, and
how it reads the calls a run makes: :func:`parse_trace` reads an ``strace -f
-y`` log of the swept kinds (:data:`KINDS`) into :class:`Call` s, and
:meth:`Trace.kills` groups the kill points that leave equal disks.
:class:`Strace` runs one process of a scenario in a forked child traced by a
new strace (the child waits until its tracer is attached), counting its calls
into a log or killed at ``when=N`` of one kind.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import os
import re
import signal
import subprocess
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import faults
from . import _output
from .job import SweepApprover, SweepJob
from .process import WINDOW_END
from .world import RUN_ID, World

__all__ = [
    "KINDS",
    "WINDOW_MARK",
    "Call",
    "Strace",
    "Trace",
    "parse_trace",
    "plan_kills",
    "trace_args",
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


# -- one traced process -----------------------------------------------------------------


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
        except BaseException as exc:  # noqa: BLE001 - a Future carries whatever the call raised
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
    if label == WINDOW_END:
        with contextlib.suppress(OSError):
            os.statvfs(WINDOW_MARK)


def traced(job: SweepJob, world: World, *, first: bool, strace: Sequence[str]) -> int:
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
            agent = job.agent(world, SweepApprover(job, world))
            start = first or not world.has_run()

            async def main() -> None:
                asyncio.get_running_loop().set_default_executor(_InlineExecutor(1))
                if start:
                    await agent.run(job.task(), run_id=RUN_ID)
                else:
                    await agent.resume(RUN_ID)

            with faults.installed(faults.CrashPlan(on_point=_mark_window)):
                asyncio.run(main())
        except BaseException:  # noqa: BLE001 - a traced child: any end is its exit status
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


def trace_args(log: Path | None, inject: tuple[str, int] | None) -> list[str]:
    """The arguments strace runs with: what it traces, where it logs, where it kills.

    The swept kinds and the window mark are logged to ``log`` (with paths), and
    the process is killed at ``inject``'s (kind, N) if given.
    """
    kinds = ",".join((*KINDS, _MARK_CALL))
    args = ["-e", f"trace={kinds}", "-o", str(log) if log is not None else "/dev/null"]
    if log is not None:
        args.append("-y")
    if inject is not None:
        kind, n = inject
        args += ["-e", f"inject={kind}:signal=KILL:when={n}"]
    return args


@dataclass(frozen=True)
class Strace:
    """The system-call kill method (:class:`~durably.sweep.process.Kill`).

    A process is killed as it enters its ``at``-th call of ``kind``; with
    ``log``, an unkilled process's calls are counted into that file.
    """

    kind: str | None = None
    log: Path | None = None
    exact = True

    def process(
        self, job: SweepJob, world: World, *, first: bool, at: int | None, record: Path | None
    ) -> int:
        """The process under strace; ``record`` is not supported (the log is the record)."""
        if record is not None:
            raise ValueError("a traced process records its calls in its log, not its points")
        if at is not None and self.kind is None:
            raise ValueError("a kill at a system call needs the call's kind")
        inject = (self.kind, at) if at is not None and self.kind is not None else None
        return traced(job, world, first=first, strace=trace_args(self.log, inject))


# -- which calls to kill at ----------------------------------------------------------


def plan_kills(
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
