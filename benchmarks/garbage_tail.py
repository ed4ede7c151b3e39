"""How long opening a journal log takes with a large tail of garbage after its records.

Issue 22 found 47 MB of garbage took 20 s to scan for a valid record after the damage.
The scan is now bounded (``framedlog.SCAN_CANDIDATES``); this times ``read_sync`` on a
run whose log ends with 47 MB of (a) random bytes and (b) crafted record headers (the
worst case: every candidate claims a huge record), against the floor of reading the
same file and searching it once for the magic bytes, measured in the same run.
Prints the median of ``--rounds`` for each, and the ratio to the floor.

Run: ``.venv/bin/python benchmarks/garbage_tail.py [--rounds N] [--mb M]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from durably.errors import CheckpointCorrupt
from durably.state import AssistantMessage, RunState, UserMessage, utcnow
from durably.stores import framedlog
from durably.stores.journal import JournalStore


def make_run(directory: Path, junk: bytes) -> Path:
    """A journal run with three records and ``junk`` after them, without a watermark."""
    store = JournalStore(directory, sync=False)
    state = RunState(run_id="r1", task="t", created_at=utcnow(), messages=[UserMessage(text="t")])
    handle = store.create_sync(state)
    for n in range(3):
        state.messages.append(AssistantMessage(text=f"reply {n}", turn=n + 1))
        state.turns = n + 1
        handle.save_sync(state)
    handle.close_sync()
    (directory / "r1.lock").write_bytes(b"")  # only the scan can judge the tail
    log = directory / "r1.1.log"
    with log.open("ab") as out:
        out.write(junk)
    return log


def timed_open(directory: Path) -> tuple[float, str]:
    """Open run r1 with a fresh journal store: the seconds it took and how the load ended."""
    started = time.perf_counter()
    try:
        JournalStore(directory).read_sync("r1")
        outcome = "loaded (tail cut as torn)"
    except CheckpointCorrupt:
        outcome = "CheckpointCorrupt"
    return time.perf_counter() - started, outcome


def timed_floor(log: Path) -> float:
    """The floor: read the log and count its magic bytes, in seconds."""
    started = time.perf_counter()
    data = log.read_bytes()
    data.count(framedlog.MAGIC)
    return time.perf_counter() - started


def main() -> None:
    """Time both garbage kinds and print medians and ratios."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mb", type=int, default=47)
    args = parser.parse_args()
    size = args.mb << 20
    kinds = {
        "random bytes": os.urandom(size),
        "crafted headers": framedlog.HEADER.pack(framedlog.MAGIC, size, 0) * (size // 12),
    }
    root = Path(tempfile.mkdtemp(prefix="durably-garbage-"))
    try:
        for name, junk in kinds.items():
            opens, floors, outcome = [], [], ""
            for round_ in range(args.rounds):
                directory = root / f"{name.replace(' ', '-')}-{round_}"
                log = make_run(directory, junk)
                floors.append(timed_floor(log))
                seconds, outcome = timed_open(directory)
                opens.append(seconds)
            median, floor = statistics.median(opens), statistics.median(floors)
            print(
                f"{args.mb} MB of {name}: open {median:.3f} s ({outcome}), "
                f"floor {floor:.3f} s, ratio {median / floor:.1f}x"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
