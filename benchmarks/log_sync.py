"""What one durable append costs on this disk, six ways: the LangGraph saver's design choice.

Each way writes ``--writes`` records of ``--size`` bytes to a fresh file, each
durable before the next (as the saver's put and put_writes are), and reports the
median and p99 of one append. The ways, taken in turn within each round:

- ``append``: ``write`` at the end of a growing file, then ``fdatasync``;
- ``reserved``: the file's space reserved first (``posix_fallocate``), then the same;
- ``zero-filled``: the file written with zeros and synced first, then the same;
- ``... + O_DSYNC``: the same three, each append one ``write`` on an ``O_DSYNC`` descriptor.

The saver uses ``reserved + O_DSYNC`` (``docs/design.md``, LangGraph saver). The
figures printed are medians over ``--rounds`` rounds.

Then the two append paths the stores had, each through the one append of
:class:`durably.stores.framedlog.FramedLog` (frame, reserve, write, flush), on
the same log file kind, interleaved in each round, with records of the
journal's size and of the LangGraph saver's:

- ``write + fdatasync``: the journal store's until issue 33 (no reservation, no ``O_DSYNC``);
- ``O_DSYNC, reserved``: the thread log's (space reserved ahead, ``O_DSYNC`` writes),
  which both stores use since (``docs/design.md``, "One append path").

Run: ``.venv/bin/python benchmarks/log_sync.py [--rounds 5] [--writes 200] [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from durably._sysio import FileSystem, filesystem_type
from durably.stores.framedlog import FramedLog, frame
from durably.stores.rundir import Claim, RunDirectory

WAYS = ("append", "reserved", "zero-filled")
SPACE = 4 << 20
"""Bytes reserved or zero-filled ahead (more than the writes need)."""


def one(directory: Path, way: str, *, dsync: bool, writes: int, size: int) -> list[float]:
    """Seconds per durable append, for one way."""
    path = directory / f"{way}{'-dsync' if dsync else ''}.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | (os.O_DSYNC if dsync else 0), 0o600)
    try:
        if way == "reserved":
            os.posix_fallocate(fd, 0, SPACE)
            os.fsync(fd)
        elif way == "zero-filled":
            os.write(fd, bytes(SPACE))
            os.fsync(fd)
            os.lseek(fd, 0, os.SEEK_SET)
        record = b"\1" * size
        seconds = []
        for _ in range(writes):
            start = time.perf_counter()
            os.write(fd, record)
            if not dsync:
                os.fdatasync(fd)
            seconds.append(time.perf_counter() - start)
        return seconds
    finally:
        os.close(fd)
        path.unlink()


PATHS = {"write + fdatasync": False, "O_DSYNC, reserved": True}
"""The framed log's two ways to flush an append (True: O_DSYNC into reserved space)."""
SIZES = {"journal": 420, "thread": 1150}
"""Record payload sizes: a journal save of a turn, a LangGraph put (benchmarks/langgraph.py)."""


def framed(directory: Path, *, dsync: bool, writes: int, size: int) -> list[float]:
    """Seconds per durable append through the framed log, one way, to a fresh log."""
    run_directory = RunDirectory(directory, sync=True, fs=FileSystem(), allow_network_fs=False)
    lock_fd = run_directory.lock("bench.lock", "bench")
    if lock_fd is None:
        raise RuntimeError(f"{directory}/bench.lock is held by another process")
    claim = Claim(run_directory, "bench", lock_fd)
    log = FramedLog(claim, "bench.1.log")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | (log.flags() if dsync else 0)
    log.attach(os.open(log.name, flags, 0o600, dir_fd=run_directory.fd()))
    if not dsync:  # the journal's append before issue 33: no O_DSYNC, nothing reserved
        log.dsync = log.reserving = False
    record = frame(b"\1" * size)
    seconds = []
    try:
        for _ in range(writes):
            start = time.perf_counter()
            log.append(record)
            seconds.append(time.perf_counter() - start)
    finally:
        log.give_back()
        log.close()
        os.unlink(log.name, dir_fd=run_directory.fd())
        claim.release()
        os.unlink("bench.lock", dir_fd=run_directory.fd())
        run_directory.close()
    return seconds


def compare_paths(directory: Path, *, rounds: int, writes: int) -> None:
    """Time the framed log's two append paths, interleaved, and print medians and ratios."""
    found: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(rounds):
        for kind, size in SIZES.items():
            for name, dsync in PATHS.items():
                seconds = sorted(framed(directory, dsync=dsync, writes=writes, size=size))
                p99 = seconds[min(len(seconds) - 1, int(len(seconds) * 0.99))]
                found.setdefault((kind, name), []).append((statistics.median(seconds), p99))
    print(
        f"\nthe framed log's append, {rounds} rounds of {writes} appends "
        f"({filesystem_type(directory)}); load average {os.getloadavg()[0]:.2f}"
    )
    for kind, size in SIZES.items():
        figures = {}
        for name in PATHS:
            rows = found[(kind, name)]
            figures[name] = (
                statistics.median(m for m, _ in rows),
                statistics.median(p for _, p in rows),
            )
        base_median, base_p99 = figures["write + fdatasync"]
        for name, (median, p99) in figures.items():
            print(
                f"{kind} records ({size} B)  {name:<18} median {median * 1e3:7.3f} ms "
                f"({median / base_median:4.2f}x)  p99 {p99 * 1e3:7.3f} ms ({p99 / base_p99:4.2f}x)"
            )


def main() -> None:
    """Time each append form and print the table (``--help`` lists the options)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--writes", type=int, default=200)
    parser.add_argument("--size", type=int, default=1150, help="bytes per record")
    parser.add_argument("--dir", type=Path, help="where the files go (a temp dir by default)")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="durably-log-sync-", dir=args.dir))
    found: dict[str, list[tuple[float, float]]] = {}
    try:
        for _ in range(args.rounds):
            for dsync in (False, True):
                for way in WAYS:
                    seconds = sorted(
                        one(directory, way, dsync=dsync, writes=args.writes, size=args.size)
                    )
                    p99 = seconds[min(len(seconds) - 1, int(len(seconds) * 0.99))]
                    name = way + (" + O_DSYNC" if dsync else "")
                    found.setdefault(name, []).append((statistics.median(seconds), p99))
    except BaseException:
        directory.rmdir()
        raise
    print(
        f"{args.rounds} rounds of {args.writes} durable appends of {args.size} bytes; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    base = statistics.median(median for median, _ in found["append"])
    for name, figures in found.items():
        median = statistics.median(m for m, _ in figures)
        p99 = statistics.median(p for _, p in figures)
        print(
            f"{name:<26} median {median * 1e3:7.3f} ms ({median / base:5.2f}x append)  "
            f"p99 {p99 * 1e3:7.3f} ms"
        )
    try:
        compare_paths(directory, rounds=args.rounds, writes=args.writes)
    finally:
        directory.rmdir()


if __name__ == "__main__":
    main()
