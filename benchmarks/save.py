"""Save latency of the snapshot FileStore against the raw floor of the same disk.

For states of about 2 KB, 50 KB and 500 KB (conversations of realistic replies and
tool results), times ``FileRun.save`` with sync on, and, interleaved with it one
iteration at a time, the floor: the same bytes written with open temp + write +
fsync + rename + directory fsync and no serialization. Then times encode + decode
of a 500 KB state.

Run: ``.venv/bin/python benchmarks/save.py [--quick] [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from durably._sysio import filesystem_type, fsync_fd
from durably.state import (
    AssistantMessage,
    RunState,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
    decode_state,
    encode_state,
)
from durably.stores._envelope import open_envelope, seal
from durably.stores.file import FileStore

SIZES = [("2 KB", 2_000), ("50 KB", 50_000), ("500 KB", 500_000)]


def build_state(run_id: str, approx_bytes: int) -> RunState:
    """A run whose conversation grows turn by turn to about ``approx_bytes`` of JSON.

    Turns are added while they bring the size closer to ``approx_bytes``.
    """
    state = RunState(
        run_id=run_id,
        task="Find why test_checkout_flow is flaky and propose a fix",
        created_at=datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC),
        messages=[UserMessage(text="Find why test_checkout_flow is flaky and propose a fix")],
    )
    turn = 0
    while True:
        before = len(encode_state(state))
        if before >= approx_bytes:
            return state
        turn += 1
        path = f"services/checkout/handlers_{turn}.py"
        arguments = json.dumps({"path": path, "pattern": r"def .*\(.*timeout"})
        state.messages.append(
            AssistantMessage(
                text=f"Looking at {path} for timeout handling that races the payment callback.",
                calls=(ToolCall(id=f"toolu_{turn:04d}", name="grep", arguments=arguments),),
                usage=Usage(
                    input_tokens=1800 + 40 * turn, output_tokens=90, cache_read_tokens=1500
                ),
                dollars=0.0061,
                model="claude-sonnet",
                turn=turn,
            )
        )
        lines = "".join(
            f"{path}:{n * 7}: async def wait_for_callback(order_id, timeout={n % 5 + 1}):\n"
            for n in range(10)
        )
        state.messages.append(ToolResult(call_id=f"toolu_{turn:04d}", name="grep", content=lines))
        state.turns = turn
        if len(encode_state(state)) - approx_bytes > approx_bytes - before:
            del state.messages[-2:]  # this turn overshoots by more than the gap it closes
            state.turns = turn - 1
            return state


def floor_save(dir_fd: int, data: bytes, counter: list[int]) -> None:
    """The raw crash-atomic write of ``data``: temp, write, fsync, rename, fsync dir."""
    counter[0] += 1
    temp = f".floor.{counter[0]}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, 0o600, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        fsync_fd(fd)
    finally:
        os.close(fd)
    os.rename(temp, "floor.json", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    fsync_fd(dir_fd)


def timed(action: Callable[[], object]) -> float:
    """Seconds one call of ``action`` took."""
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def p99(samples: list[float]) -> float:
    """The 99th percentile of the samples."""
    return statistics.quantiles(samples, n=100, method="inclusive")[98]


def ms(seconds: float) -> str:
    """Seconds as milliseconds with three decimals."""
    return f"{seconds * 1000:8.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    parser.add_argument("--dir", help="directory on the disk to measure (default: a temp dir)")
    args = parser.parse_args()
    full = {"2 KB": 1000, "50 KB": 600, "500 KB": 400}
    iterations = {label: count // 20 for label, count in full.items()} if args.quick else full
    codec_runs = 30 if args.quick else 300

    base = tempfile.mkdtemp(prefix="durably-bench-", dir=args.dir)
    try:
        print(
            f"durably save benchmark: Python {platform.python_version()}, {sys.platform}, "
            f"{os.cpu_count()} CPUs, file system {filesystem_type(base)} at {base}"
        )
        print(
            "store = FileStore(sync=True).save (seal + crash-atomic write); "
            "floor = same bytes, temp+write+fsync+rename+dir fsync"
        )
        print()
        header = (
            f"{'state':>7} {'bytes':>8} {'n':>4} | {'store med':>9} {'store p99':>9} | "
            f"{'floor med':>9} {'floor p99':>9} | {'ratio med':>9} {'ratio p99':>9}"
        )
        print(header)
        print("-" * len(header))
        for label, approx in SIZES:
            state = build_state(f"bench-{approx}", approx)
            data = seal(state)
            store = FileStore(Path(base) / f"store-{approx}")
            handle = store.create_sync(state)
            floor_dir = Path(base) / f"floor-{approx}"
            floor_dir.mkdir(mode=0o700)
            floor_fd = os.open(floor_dir, os.O_RDONLY | os.O_DIRECTORY)
            counter = [0]
            for _ in range(5):  # warm up both paths
                handle.save_sync(state)
                floor_save(floor_fd, data, counter)
            stored: list[float] = []
            floor: list[float] = []
            for n in range(iterations[label]):
                store_first = n % 2 == 0
                for which in ("store", "floor") if store_first else ("floor", "store"):
                    if which == "store":
                        stored.append(timed(partial(handle.save_sync, state)))
                    else:
                        floor.append(timed(partial(floor_save, floor_fd, data, counter)))
            handle.close_sync()
            store.close()
            os.close(floor_fd)
            s_med, f_med = statistics.median(stored), statistics.median(floor)
            s_p99, f_p99 = p99(stored), p99(floor)
            print(
                f"{label:>7} {len(data):>8} {len(stored):>4} | {ms(s_med)}ms {ms(s_p99)}ms | "
                f"{ms(f_med)}ms {ms(f_p99)}ms | {s_med / f_med:9.2f} {s_p99 / f_p99:9.2f}"
            )

        state = build_state("bench-codec", 500_000)
        body = encode_state(state)
        sealed = seal(state)
        encode_decode = [
            timed(lambda: decode_state(encode_state(state))) for _ in range(codec_runs)
        ]
        seal_open = [timed(lambda: open_envelope(seal(state), path="x")) for _ in range(codec_runs)]
        print()
        print(
            f"codec, {len(body)} byte state ({len(state.messages)} messages), "
            f"median of {codec_runs} runs:"
        )
        print(f"  encode_state + decode_state:  {ms(statistics.median(encode_decode))}ms")
        print(
            f"  seal + open_envelope (crc32): {ms(statistics.median(seal_open))}ms "
            f"({len(sealed)} bytes on disk)"
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
