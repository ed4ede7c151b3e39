"""Chained kills: one process reaches a run of crash points in turn, dying at each.

The sweep kills a process at each of many points of the same run: a batch of
first crashes from a fresh world, or a group's second crashes (the first
restart's recovery points) from its first crash's disk. Started afresh for
each point, every one of those processes repeats the same work up to its
point, and pays a process's start (its copy-on-write faults) again.

Chained, one process runs. At each point it forks a *continuation*, a copy of
itself at that instant, which waits; the process reports its point and
SIGKILLs itself through its crash plan, as every process of a sweep dies (no
``finally``, no polite release). The harness reaps it, checks that SIGKILL
ended it, copies the disk it left, and lets the continuation go on to the next
point, where the same happens. The disk copied at point *m* is the disk a
fresh process killed at *m* leaves: the process was at *m*, as a fresh one
would be, when it died, and a dead process writes nothing. Each copy is later
laid down at the same path and restarted to the end, as the unchained sweep
does with a first crash's disk.

A fork is only safe where nothing else is moving: a point reached on the main
thread with no job in flight in the executor (the copy has no other thread; a
fresh executor serves it). Elsewhere the process still reports the point and
dies there, and the chain ends: the points after it get a new chain. Orphaned
continuations are reparented to the harness, made a child subreaper for the
chain's lifetime, so it reaps every one.

:func:`chain_kills` kills at points given in advance and stops after the
last. :func:`chain_to_end` lets the chain's process pick its points as it
reaches them (the sweep's first restart picks the new ones of its recovery
window), and lets the continuation after the last kill run on to the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import faults
from .tree import Tree

__all__ = ["Chain", "ChainedKill", "chain_kills", "chain_to_end", "chaining_possible"]

_PR_SET_CHILD_SUBREAPER = 36
"""prctl(2) option: orphaned descendants are reparented to this process, not init."""
_PR_GET_CHILD_SUBREAPER = 37


@dataclass(frozen=True)
class ChainedKill:
    """The disk one chained process left when it was killed at ``point``."""

    point: int
    disk: Tree


class _CountingExecutor(ThreadPoolExecutor):
    """The default executor of a chained process: it knows whether a job is in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: set[Future[Any]] = set()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future = super().submit(fn, *args, **kwargs)
        self.pending.add(future)  # set.add and discard are atomic under the GIL
        future.add_done_callback(self.pending.discard)
        return future


@functools.cache
def _prctl() -> Callable[..., int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return None


def _subreaper_flag() -> int | None:
    """This process's child-subreaper flag, or None where prctl(2) has none."""
    prctl = _prctl()
    flag = ctypes.c_int()
    if prctl is None or prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) != 0:
        return None
    return flag.value


def chaining_possible() -> bool:
    """Whether this system lets the harness become a child subreaper (Linux does)."""
    return _subreaper_flag() is not None


@contextmanager
def _subreaper() -> Iterator[None]:
    """This process a child subreaper for the block; its flag as it was afterwards."""
    before, prctl = _subreaper_flag(), _prctl()
    if before is None or prctl is None or prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "cannot become a child subreaper")
    try:
        yield
    finally:
        prctl(_PR_SET_CHILD_SUBREAPER, before, 0, 0, 0)


def _died_by_sigkill(pid: int) -> bool:
    """Wait for ``pid`` (a child of this process) to end; whether a SIGKILL ended it."""
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def chain_kills(
    root: Path,
    points: Sequence[int],
    start: Callable[[faults.CrashPlan, Callable[[], None]], None],
) -> list[ChainedKill]:
    """Kill one chain of processes at ``points`` (ascending); the disk under ``root`` at each.

    ``start(plan, prepare)`` runs the restart with ``plan`` installed, calling
    ``prepare`` inside its event loop first; it is called in a child of this
    process. The chain may end before the last point (a point where a fork is
    unsafe ends it after that point's kill; a process that never reached its
    point, or did not die there, ends it too): the caller runs what is left.
    """
    wanted = sorted(set(points))
    if not wanted:
        return []
    targets = set(wanted)
    return _run_chain(root, lambda point, _label: point in targets, start, last=wanted[-1]).kills


@dataclass(frozen=True)
class Chain:
    """What a chain run on to its end left: its kills, and how its last process ended."""

    kills: list[ChainedKill]
    status: int | None
    """The wait status of the process that ran on past the last kill to the run's end;
    None when the chain ended at a kill (a point where a fork was unsafe) or was cut short."""


def chain_to_end(
    root: Path,
    kill_here: Callable[[int, str], bool],
    start: Callable[[faults.CrashPlan, Callable[[], None]], None],
) -> Chain:
    """Kill one chain of processes at each point ``kill_here`` picks, then let it finish.

    ``kill_here(point, label)`` is asked in the chain's process at every point
    (1-based index, label), so it can decide from what the process sees there;
    ``start`` is as for :func:`chain_kills`. The process alive after the last
    kill runs on to the end of ``start``, and its wait status is returned.
    """
    return _run_chain(root, kill_here, start, last=None)


def _run_chain(
    root: Path,
    kill_here: Callable[[int, str], bool],
    start: Callable[[faults.CrashPlan, Callable[[], None]], None],
    *,
    last: int | None,
) -> Chain:
    """The harness's side of a chain; with ``last``, the chain stops after that point's kill."""
    report_r, report_w = os.pipe()
    go_r, go_w = os.pipe()
    kills: list[ChainedKill] = []
    status: int | None = None
    with _subreaper():
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child's coverage is not collected
            os.close(report_r)
            os.close(go_w)
            _chained_child(kill_here, report_w, go_r, start)
        os.close(report_w)
        os.close(go_r)
        alive = {pid: None}  # the chain's processes not yet reaped, oldest first
        with os.fdopen(report_r, "r") as reports:
            try:
                for line in reports:
                    point, dying, continuation = (int(word) for word in line.split())
                    if continuation:
                        alive[continuation] = None
                    del alive[dying]
                    if not _died_by_sigkill(dying):
                        break
                    kills.append(ChainedKill(point, Tree.read(root)))
                    if not continuation or point == last:
                        break
                    os.write(go_w, b"g")
                else:
                    # Every process of the chain has closed the report pipe: the one
                    # still unreaped ran on past the last kill and has ended.
                    for finisher in list(alive):
                        del alive[finisher]
                        _, status = os.waitpid(finisher, 0)
            finally:
                # A chain ended, or cut short: none of it may outlive the call. A
                # continuation still waiting to go on reads the end of the go pipe and
                # exits; every process of the chain writes its report before it dies.
                os.close(go_w)
                for straggler in alive:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(straggler, signal.SIGKILL)
                for line in reports:
                    alive.update((int(word), None) for word in line.split()[1:] if word != "0")
                for straggler in alive:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(straggler, 0)
    return Chain(kills, status if last is None else None)


def _chained_child(
    kill_here: Callable[[int, str], bool],
    report_w: int,
    go_r: int,
    start: Callable[[faults.CrashPlan, Callable[[], None]], None],
) -> None:  # pragma: no cover - runs in the chain's processes
    plan = faults.CrashPlan()
    executor: list[_CountingExecutor] = []

    def prepare() -> None:
        executor[:] = [_CountingExecutor()]
        asyncio.get_running_loop().set_default_executor(executor[0])

    def at_point(label: str) -> None:
        point = len(plan.reached)
        if not kill_here(point, label):
            return
        safe = (
            threading.current_thread() is threading.main_thread()
            and threading.active_count() - len(executor[0]._threads if executor else ()) == 1  # noqa: SLF001 -- the executor is ours
            and not (executor and executor[0].pending)
        )
        continuation = 0
        if safe:
            loop = asyncio.get_running_loop()
            continuation = os.fork()
            if continuation == 0:
                # The copy: wait for the harness to kill the original and read its disk.
                if os.read(go_r, 1) != b"g":
                    os._exit(0)
                # asyncio forgets a running loop in a forked child (it checks the pid,
                # and from Python 3.12 resets it at fork): this copy goes on running it.
                asyncio.events._set_running_loop(loop)  # noqa: SLF001 -- exported (events.__all__) for loop implementations
                prepare()  # the original's executor threads did not come along
                return
        os.write(report_w, f"{point} {os.getpid()} {continuation}\n".encode())
        plan.kill()  # SIGKILL, as every process of a sweep dies at its point

    plan.on_point = at_point
    code = 0
    try:
        start(plan, prepare)
    except BaseException:  # noqa: BLE001 - a forked child: any end is its exit status
        code = 1
    os._exit(code)
