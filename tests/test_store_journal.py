"""The journal store: one append per save, torn tails cut, bad middles refused, power cuts."""

from __future__ import annotations

import contextlib
import functools
import os
import random
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest

import durably
from _helpers.mutants import no_datasync
from _helpers.patience import stretched
from durably import faults
from durably.state import AssistantMessage, RunState, ToolCall, ToolResult, UserMessage, utcnow
from durably.stores import framedlog
from durably.stores.journal import JournalRun, JournalStore
from durably.sweep.powerloss import check_protocol

# Compact whenever the log outgrows half the snapshot: both paths run in a few saves.
EAGER = functools.partial(JournalStore, compact_min_bytes=0, compact_ratio=0.5)


def a_state(run_id: str = "r1") -> RunState:
    """A fresh run state holding only the task."""
    return RunState(run_id=run_id, task="t", created_at=utcnow(), messages=[UserMessage(text="t")])


def grow(state: RunState, n: int) -> None:
    """Append one reply and its result, as the loop does."""
    call = ToolCall(id=f"c{n}", name="tool", arguments=f'{{"n": {n}}}')
    state.messages.append(AssistantMessage(text=f"turn {n}", calls=(call,), turn=n))
    state.messages.append(ToolResult(call_id=call.id, name="tool", content="x" * (50 * n)))
    state.turns = n


def without_saved_at(state: RunState) -> RunState:
    """``state`` with its save time cleared, to compare as loaded."""
    state.saved_at = None
    return state


def test_a_save_appends_only_the_change(tmp_path: Path) -> None:
    """After the first snapshot, each save appends one record to the log and leaves the snapshot."""
    store = JournalStore(tmp_path / "runs")
    state = a_state()
    handle = store.create_sync(state)
    snapshot = (tmp_path / "runs" / "r1.json").read_bytes()
    sizes = []
    for n in range(1, 6):
        grow(state, n)
        handle.save_sync(state)
        data = (tmp_path / "runs" / "r1.1.log").read_bytes()  # reserved space past the end
        sizes.append(max(end for _, _, end in framedlog.payloads(data, path="r1.1.log")))
    handle.close_sync()
    assert (tmp_path / "runs" / "r1.json").read_bytes() == snapshot
    steps = [b - a for a, b in zip([0, *sizes], sizes, strict=False)]
    assert all(step < 1000 for step in steps)  # each record holds one turn, not the history
    assert without_saved_at(store.read_sync("r1")) == without_saved_at(state)


def test_a_rewritten_history_compacts_into_a_new_generation(tmp_path: Path) -> None:
    """When the context policy rewrites history, the store writes a snapshot and a fresh log."""
    store = JournalStore(tmp_path / "runs")
    state = a_state()
    handle = store.create_sync(state)
    grow(state, 1)
    handle.save_sync(state)
    state.summary, state.summarized = "earlier work", 2
    state.messages = state.messages[2:]
    handle.save_sync(state)
    grow(state, 2)
    handle.save_sync(state)
    handle.close_sync()
    names = sorted(os.listdir(tmp_path / "runs"))
    assert names == ["r1.2.log", "r1.json", "r1.lock"]
    assert without_saved_at(store.read_sync("r1")) == without_saved_at(state)


def log_with_records(tmp_path: Path, count: int) -> tuple[JournalStore, list[RunState], Path]:
    """A journal run saved ``count`` times after its snapshot: store, saved states, log."""
    store = JournalStore(tmp_path / "runs", sync=False)
    state = a_state()
    handle = store.create_sync(state)
    history = [msgspec_copy(state)]
    for n in range(1, count + 1):
        grow(state, n)
        handle.save_sync(state)
        history.append(msgspec_copy(state))
    handle.close_sync()
    return store, history, tmp_path / "runs" / "r1.1.log"


def msgspec_copy(state: RunState) -> RunState:
    """A deep copy of ``state``, through the codec."""
    return durably.state.decode_state(durably.state.encode_state(state))


def header_size(data: bytes) -> int:
    """The size of the log's header record (``seq 0``)."""
    framed = framedlog.unframe(data, 0)
    assert framed is not None
    return framed[1]


def test_every_truncation_of_the_log_loads_a_saved_state_and_cuts_the_tail(tmp_path: Path) -> None:
    """Without a watermark (a power cut lost it), a log cut after its header loads the last whole
    record's state and opening trims the tail; a cut into the header is CheckpointCorrupt.
    """
    store, history, log = log_with_records(tmp_path, 3)
    (tmp_path / "runs" / "r1.lock").write_bytes(b"")
    data = log.read_bytes()
    for cut in range(len(data)):
        log.write_bytes(data[:cut])
        if cut < header_size(data):
            with pytest.raises(durably.CheckpointCorrupt, match="header"):
                store.read_sync("r1")
            continue
        loaded = without_saved_at(store.read_sync("r1"))
        assert loaded in [without_saved_at(msgspec_copy(h)) for h in history]
        assert log.read_bytes() == data[:cut]  # reading without the lock changes nothing
    log.write_bytes(data[: len(data) - 3])
    handle, state = store.open_sync("r1")
    handle.close_sync()
    assert without_saved_at(state) == without_saved_at(msgspec_copy(history[2]))
    assert len(log.read_bytes()) < len(data) - 3  # the torn record was cut off


def test_a_truncated_log_that_lost_an_acknowledged_save_is_corrupt(tmp_path: Path) -> None:
    """Any cut of a log below the lock file's watermark is CheckpointCorrupt, and nothing is cut."""
    store, _, log = log_with_records(tmp_path, 3)
    data = log.read_bytes()
    for cut in range(len(data)):
        log.write_bytes(data[:cut])
        with pytest.raises(durably.CheckpointCorrupt, match=r"r1\.1\.log"):
            store.read_sync("r1")
    log.write_bytes(data[: len(data) // 2])
    with pytest.raises(durably.CheckpointCorrupt, match="acknowledged"):
        store.open_sync("r1")
    assert log.read_bytes() == data[: len(data) // 2]


def test_a_damaged_record_with_records_after_it_is_corrupt(tmp_path: Path) -> None:
    """A bad checksum mid-log is CheckpointCorrupt, never skipped, and the file is untouched,
    even with no watermark to compare the log with.
    """
    store, _, log = log_with_records(tmp_path, 3)
    data = bytearray(log.read_bytes())
    ends = [0]  # where each record ends: the log's header record, then the saves
    while (framed := framedlog.unframe(bytes(data), ends[-1])) is not None:
        ends.append(framed[1])
    assert len(ends) >= 4, "a header and at least two saves"
    data[ends[1] + 20] ^= 0xFF  # inside the first save's record, with saves after it
    log.write_bytes(bytes(data))
    # Without the lock file's watermark (unsynced: a power cut can lose it), only the
    # log's own framing can tell this damage from a torn tail.
    (log.parent / "r1.lock").write_bytes(b"")
    with pytest.raises(durably.CheckpointCorrupt, match=r"r1\.1\.log"):
        store.open_sync("r1")
    assert log.read_bytes() == bytes(data)


def test_random_byte_flips_are_corrupt_or_a_saved_state(tmp_path: Path) -> None:
    """Any single flipped byte of the log loads a saved state or raises CheckpointCorrupt."""
    store, history, log = log_with_records(tmp_path, 4)
    data = log.read_bytes()
    saved = [without_saved_at(msgspec_copy(h)) for h in history]
    rng = random.Random(7)
    for _ in range(300):
        flipped = bytearray(data)
        flipped[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        log.write_bytes(bytes(flipped))
        try:
            loaded = without_saved_at(store.read_sync("r1"))
        except durably.CheckpointCorrupt:
            continue
        assert loaded in saved


def test_the_journal_survives_every_power_cut() -> None:
    """At every operation of a create and four saves, every legal disk loads old or new."""
    assert check_protocol(saves=4, store=JournalStore) == []
    assert check_protocol(saves=4, store=JournalStore, resume=True) == []


def test_compaction_survives_every_power_cut() -> None:
    """With compaction at most saves, every legal disk at every point still loads old or new."""
    assert check_protocol(saves=5, store=EAGER) == []


@contextmanager
def checksum_unchecked() -> Iterator[None]:
    """A mutant: records are read without checking their CRC."""

    def unframe(data: bytes, offset: int) -> tuple[bytes, int] | None:
        if offset + framedlog.HEADER.size > len(data):
            return None
        _, length, _ = framedlog.HEADER.unpack_from(data, offset)
        end = offset + framedlog.HEADER.size + length
        return data[offset + framedlog.HEADER.size : min(end, len(data))], min(end, len(data))

    with mock.patch.object(framedlog, "unframe", unframe):
        yield


@contextmanager
def log_deleted_early() -> Iterator[None]:
    """A mutant: compaction removes the old log before the new snapshot is durable."""

    def write_snapshot(self: JournalRun, data: bytes) -> None:
        if self._generation:  # the mutant: drop the old log before the new snapshot is durable
            with contextlib.suppress(FileNotFoundError):
                self._store.fs.unlink(
                    framedlog.log_name(self._run_id, self._generation),
                    dir_fd=self._store._directory_fd(),  # noqa: SLF001 -- a mutant of compaction's internals
                )
        durably.stores.file.FileRun._write_snapshot(self, data)  # noqa: SLF001 -- a mutant of compaction's internals

    with mock.patch.object(JournalRun, "_write_snapshot", write_snapshot):
        yield


Mutant = Callable[[], contextlib.AbstractContextManager[None]]

MUTANTS: dict[str, tuple[Mutant, Callable[..., JournalStore]]] = {
    "no fdatasync": (no_datasync, JournalStore),
    "checksum not checked": (checksum_unchecked, JournalStore),
    "old log deleted before the snapshot's directory sync": (log_deleted_early, EAGER),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_each_journal_mutant_is_caught(name: str) -> None:
    """Each seeded flaw of the journal protocol shows up as a power-cut violation."""
    mutant, store = MUTANTS[name]
    with mutant():
        violations = check_protocol(saves=5, store=store)
    assert violations, f"mutant {name!r} was not caught"


CHILD = """
import sys
from durably.stores.journal import JournalStore
store = JournalStore(sys.argv[1])
handle, state = store.open_sync("r1")
print("held", flush=True)
sys.stdin.readline()
"""


TRY_OPEN = """
import sys
from durably.stores.journal import JournalStore
try:
    JournalStore(sys.argv[1]).open_sync("r1")
except Exception as exc:
    print(type(exc).__name__)
"""


def test_a_second_process_gets_locked_until_the_first_dies(tmp_path: Path) -> None:
    """While one process holds a journal run another gets Locked; after a SIGKILL it opens."""
    store = JournalStore(tmp_path / "runs")
    store.create_sync(a_state()).close_sync()
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path / "runs")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        other = subprocess.run(
            [sys.executable, "-c", TRY_OPEN, str(tmp_path / "runs")],
            capture_output=True,
            text=True,
            timeout=stretched(30),
            check=True,
        )
        assert other.stdout.strip() == "Locked"
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    handle, _ = JournalStore(tmp_path / "runs").open_sync("r1")
    handle.close_sync()


def test_a_crash_at_each_append_point_loads_old_or_new(tmp_path: Path) -> None:
    """SIGKILL after a record is written or flushed leaves the old or the new state on open."""
    for label in ("store.append.written", "store.append.synced"):
        directory = tmp_path / label
        store = JournalStore(directory)
        state = a_state()
        handle = store.create_sync(state)
        grow(state, 1)
        handle.save_sync(state)
        handle.close_sync()
        old = without_saved_at(msgspec_copy(state))
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            child = JournalStore(directory)
            held, loaded = child.open_sync("r1")
            grow(loaded, 2)
            with faults.installed(faults.CrashPlan(label=label)):
                held.save_sync(loaded)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status)
        assert os.WTERMSIG(status) == signal.SIGKILL
        handle, loaded = JournalStore(directory).open_sync("r1")
        handle.close_sync()
        assert without_saved_at(loaded).turns in (old.turns, 2)
