"""Sweep workers started as fresh interpreters, so scenario processes fork from a small one.

Each scenario forks two or three processes from a worker. A worker forked from
the caller carries the caller's whole heap, and every fork and exit of a
scenario process pays for it (page tables copied, pages faulted in and freed).
From a caller holding 500 MB, one configuration's depth-2 sweep of the triage
job took a median 29.9 s with forked workers and 19.1 s with fresh ones
(``benchmarks/sweep.py --ballast 300 --workers both --config "keys honoured"``).
A test session is such a caller. A worker started here holds only durably, the
job's own modules and one warm-up run.

The task, the job, its configuration and its store factory travel pickled, and
the worker takes the caller's ``sys.path`` first, so a job class defined in a
test module is imported by the same name. What the caller changed in its own
memory (a monkeypatch, a fake service) does not travel: that is why forked
workers stay the default and fresh ones are asked for (``workers="fresh"``).
A job that cannot travel (a class defined inside a function, or in a script
run as ``__main__``) is refused with the reason, before any work.

One socket pair per worker carries multiprocessing's framed messages:

    caller -> worker   sys.path; then the pickled (task, warm-up function, job, config, store)
    worker -> caller   ("ready",) after its warm-up, or ("unusable", why)
    caller -> worker   an item                (repeated)
    worker -> caller   ("done", outcome) or ("raised", exception)
    end of input       the worker exits
"""

from __future__ import annotations

import pickle
import socket
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, cast

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
"""The directory holding the ``durably`` package, so a worker imports this same copy."""

_NO_MORE = object()

_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[2]); "
    "from durably.sweep._fresh import serve; serve(int(sys.argv[1]))"
)


class FreshWorkers:
    """Worker interpreters, each warmed up and waiting for items."""

    def __init__(self, processes: list[subprocess.Popen[bytes]], conns: list[Connection]) -> None:
        self._processes = dict(zip(conns, processes, strict=True))

    @property
    def pids(self) -> list[int]:
        """The workers' process IDs."""
        return [process.pid for process in self._processes.values()]

    def imap_unordered(self, items: Iterable[Any]) -> Iterator[Any]:
        """Each item's outcome as soon as a worker has it, keeping every worker busy.

        An exception a task raised is raised here; the workers are then fit only
        to be closed (other workers' outcomes may still be on their way).
        """
        waiting = iter(items)
        busy: set[Connection] = set()

        def give(conn: Connection) -> None:
            item = next(waiting, _NO_MORE)
            if item is not _NO_MORE:
                conn.send(item)
                busy.add(conn)

        for conn in self._processes:
            give(conn)
        while busy:
            for conn in cast(list[Connection], wait(list(busy))):
                busy.discard(conn)
                try:
                    kind, value = conn.recv()
                except EOFError:
                    status = self._processes[conn].wait()
                    raise RuntimeError(f"a sweep worker died (exit status {status})") from None
                if kind == "raised":
                    raise value
                give(conn)
                yield value

    def close(self) -> None:
        """End every worker's input and wait for it; kill one that does not stop."""
        for conn in self._processes:
            conn.close()
        for process in self._processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def check_picklable(*parts: object) -> bytes:
    """The parts pickled; ValueError saying why when they cannot be."""
    try:
        return pickle.dumps(parts, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise ValueError(
            f"workers='fresh' sends the job to new interpreters, and it cannot be pickled "
            f"({type(exc).__name__}: {exc}); define its class at the top of a module, or "
            "use workers='fork'"
        ) from exc


def start(
    jobs: int,
    task: Callable[[Any], Any],
    warm_up: tuple[Any, ...],
    *,
    prepare: Callable[..., object] | None = None,
) -> FreshWorkers:
    """``jobs`` warmed-up worker interpreters.

    Args:
        jobs: how many workers.
        task: what a worker does to each item.
        warm_up: the arguments of ``prepare``, sent with it.
        prepare: run as ``prepare(*warm_up)`` once in each worker before it says it
            is ready (the sweep hands its warm-up run); None for no warm-up.
            Handed in, so this module needs nothing of the sweep's.

    Raises:
        ValueError: the task or job cannot be pickled here, or unpickled there.
    """
    setup = check_picklable(task, prepare, *warm_up)
    processes: list[subprocess.Popen[bytes]] = []
    conns: list[Connection] = []
    try:
        for _ in range(jobs):
            ours, theirs = socket.socketpair()
            with theirs:
                processes.append(
                    subprocess.Popen(
                        [sys.executable, "-c", _BOOT, str(theirs.fileno()), _PACKAGE_ROOT],
                        pass_fds=[theirs.fileno()],
                        stdin=subprocess.DEVNULL,
                    )
                )
            conns.append(Connection(ours.detach()))
            conns[-1].send(list(sys.path))
            conns[-1].send_bytes(setup)
        answers = []
        for conn in conns:  # every worker warms up at once; collect them in turn
            try:
                answers.append(conn.recv())
            except EOFError:
                answers.append(("unusable", "the worker exited before it was ready"))
    except BaseException:
        _stop(processes, conns)
        raise
    for answer in answers:
        if answer[0] != "ready":
            _stop(processes, conns)
            raise ValueError(f"{answer[1]}; use workers='fork'")
    return FreshWorkers(processes, conns)


def _stop(processes: list[subprocess.Popen[bytes]], conns: list[Connection]) -> None:
    for conn in conns:
        conn.close()
    for process in processes:
        process.kill()
        process.wait()


def serve(fd: int) -> None:
    """A worker's life: set up, warm up, then do items until the caller hangs up."""
    conn = Connection(fd)
    try:
        sys.path[:] = conn.recv()
        try:
            # The caller's own bytes over a socket pair only the two processes hold.
            task, prepare, *warm_up = pickle.loads(conn.recv_bytes())  # noqa: S301
        except Exception as exc:  # noqa: BLE001 - any unpickling error is reported to the parent as unusable
            why = f"{type(exc).__name__}: {exc}"
            conn.send(("unusable", f"the job cannot be unpickled in a fresh interpreter ({why})"))
            return
        if prepare is not None:
            prepare(*warm_up)
        conn.send(("ready",))
        while True:
            try:
                item = conn.recv()
            except EOFError:
                return
            try:
                outcome = ("done", task(item))
            except Exception as exc:  # noqa: BLE001 - the task's own error goes back to the parent
                outcome = ("raised", exc)
            try:
                conn.send(outcome)  # pickled whole before a byte is sent
            except Exception as exc:  # noqa: BLE001 - an outcome that cannot be pickled is reported, not lost
                cause = outcome[1] if outcome[0] == "raised" else exc
                text = "".join(traceback.format_exception(cause))
                conn.send(("raised", RuntimeError(f"a sweep worker failed:\n{text}")))
    except (KeyboardInterrupt, BrokenPipeError, ConnectionResetError):
        return  # the caller is stopping or gone; it reports what happened
