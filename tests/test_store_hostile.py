"""The file stores against damaged disks and hostile files (issue 22)."""

from __future__ import annotations

import os
import stat
import threading
import zlib
from pathlib import Path
from unittest import mock

import msgspec
import pytest

import durably
from durably.checkpoint.envelope import seal
from durably.state import AssistantMessage, RunState, ToolCall, ToolResult, UserMessage, utcnow
from durably.stores import framedlog
from durably.stores.file import FileStore
from durably.stores.journal import JournalStore

STORES = [FileStore, JournalStore]


def a_state(run_id: str = "r1") -> RunState:
    """A fresh run state holding only the task."""
    return RunState(run_id=run_id, task="t", created_at=utcnow(), messages=[UserMessage(text="t")])


def grow(state: RunState, n: int) -> None:
    """Append turn ``n``: one reply with a call and its result."""
    call = ToolCall(id=f"c{n}", name="tool", arguments="{}")
    state.messages.append(AssistantMessage(text=f"turn {n}", calls=(call,), turn=n))
    state.messages.append(ToolResult(call_id=call.id, name="tool", content="x" * 40))
    state.turns = n


def journal_run(tmp_path: Path, saves: int = 3) -> tuple[JournalStore, Path]:
    """A closed journal run ``r1`` with ``saves`` appended records; returns its directory."""
    store = JournalStore(tmp_path / "runs", sync=False)
    state = a_state()
    handle = store.create_sync(state)
    for n in range(1, saves + 1):
        grow(state, n)
        handle.save_sync(state)
    handle.close_sync()
    return store, tmp_path / "runs"


# -- 1: what decides a checkpoint's meaning is under its checksum --------------------------


def test_a_changed_log_generation_is_corrupt_and_the_log_is_kept(tmp_path: Path) -> None:
    """Changing the snapshot's log generation fails the checksum; opening deletes no log."""
    store, runs = journal_run(tmp_path)
    snapshot = runs / "r1.json"
    snapshot.write_bytes(snapshot.read_bytes().replace(b'"journal":1,', b'"journal":3,'))
    log = (runs / "r1.1.log").read_bytes()
    with pytest.raises(durably.CheckpointCorrupt, match="checksum mismatch"):
        store.open_sync("r1")
    assert (runs / "r1.1.log").read_bytes() == log


def test_a_snapshot_whose_log_is_missing_is_corrupt_never_a_fresh_start(tmp_path: Path) -> None:
    """A snapshot naming a log that does not exist is CheckpointCorrupt, even right after a
    compaction (whose log holds only its header).
    """
    store, runs = journal_run(tmp_path, saves=0)
    (runs / "r1.1.log").unlink()
    with pytest.raises(durably.CheckpointCorrupt, match="it is missing"):
        store.read_sync("r1")


def test_a_snapshot_older_than_a_log_with_saves_is_corrupt(tmp_path: Path) -> None:
    """A snapshot put back to an older generation, while a newer log holds saves, is corrupt."""
    store = JournalStore(tmp_path / "runs", sync=False, compact_min_bytes=0, compact_ratio=0.0)
    state = a_state()
    handle = store.create_sync(state)
    old_snapshot = (tmp_path / "runs" / "r1.json").read_bytes()
    old_log = (tmp_path / "runs" / "r1.1.log").read_bytes()
    grow(state, 1)
    handle.save_sync(state)  # compacts: generation 2
    store.compact_ratio = 1e9
    grow(state, 2)
    handle.save_sync(state)  # appended to generation 2's log
    handle.close_sync()
    (tmp_path / "runs" / "r1.json").write_bytes(old_snapshot)
    (tmp_path / "runs" / "r1.1.log").write_bytes(old_log)
    (tmp_path / "runs" / "r1.lock").write_bytes(b"")  # even without the watermark
    with pytest.raises(durably.CheckpointCorrupt, match="holds later saves"):
        store.open_sync("r1")
    assert (tmp_path / "runs" / "r1.2.log").exists()


# -- 5: lost acknowledged saves, bounded scan --------------------------------------------


def test_a_flipped_bit_in_the_last_record_is_corrupt_not_a_torn_tail(tmp_path: Path) -> None:
    """A finished last record that fails its checksum lost an acknowledged save: corrupt."""
    store, runs = journal_run(tmp_path)
    log = runs / "r1.1.log"
    data = bytearray(log.read_bytes())
    data[-5] ^= 0x01
    log.write_bytes(bytes(data))
    with pytest.raises(durably.CheckpointCorrupt, match="acknowledged"):
        store.open_sync("r1")
    assert log.read_bytes() == bytes(data)


def test_the_scan_of_trailing_garbage_is_bounded(tmp_path: Path) -> None:
    """Garbage full of record headers after the last record is refused after a bounded number of
    candidate checks, not scanned candidate by candidate to its end.
    """
    store, runs = journal_run(tmp_path)
    (runs / "r1.lock").write_bytes(b"")  # no watermark: only the scan can tell
    log = runs / "r1.1.log"
    header = framedlog.HEADER.pack(framedlog.MAGIC, 1 << 30, 0)
    log.write_bytes(log.read_bytes() + header * 100_000)
    calls = 0
    real = framedlog.unframe

    def counting(data: bytes, offset: int) -> tuple[bytes, int] | None:
        nonlocal calls
        calls += 1
        return real(data, offset)

    with (
        mock.patch.object(framedlog, "unframe", counting),
        pytest.raises(durably.CheckpointCorrupt, match="not one unfinished append"),
    ):
        store.read_sync("r1")
    assert calls <= framedlog.SCAN_CANDIDATES + 10


# -- 3: foreign or group/other-writable files and directories ---------------------------


@pytest.mark.parametrize("store_class", STORES)
def test_a_group_or_other_writable_state_directory_is_refused(
    tmp_path: Path, store_class: type[FileStore]
) -> None:
    """A state directory others can write is refused, naming its path, owner and mode."""
    runs = tmp_path / "runs"
    store_class(runs).create_sync(a_state()).close_sync()
    runs.chmod(0o777)
    with pytest.raises(durably.UnsafePath) as caught:
        store_class(runs).open_sync("r1")
    message = str(caught.value)
    assert f"refusing to use {runs}" in message
    assert f"owned by uid {os.geteuid()}" in message
    assert "with mode 0777" in message


@pytest.mark.parametrize("name", ["r1.json", "r1.lock", "r1.1.log"])
def test_a_group_or_other_writable_store_file_is_refused(tmp_path: Path, name: str) -> None:
    """A checkpoint, lock or log file others can write is refused by open and read alike."""
    store, runs = journal_run(tmp_path)
    (runs / name).chmod(0o666)
    with pytest.raises(durably.UnsafePath, match=r"mode 0666"):
        store.open_sync("r1")
    if name != "r1.lock":  # a reader never opens the lock itself for writing
        with pytest.raises(durably.UnsafePath, match=r"mode 0666"):
            JournalStore(runs).read_sync("r1")


def test_directories_are_made_0700_whatever_the_umask(tmp_path: Path) -> None:
    """Under umask 000 the state directory and the parents the store makes are all 0700."""
    old = os.umask(0)
    try:
        JournalStore(tmp_path / "a" / "b" / "runs").create_sync(a_state()).close_sync()
    finally:
        os.umask(old)
    for directory in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "runs"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory


# -- 9, 10, 14: nesting, FIFOs, directories in the way, ranges, readers --------------------


def nested(depth: int) -> bytes:
    """JSON nested ``depth`` levels deep."""
    return b"[" * depth + b"]" * depth


def test_deeply_nested_json_is_corrupt_not_a_recursion_error(tmp_path: Path) -> None:
    """100,000 levels of nesting in a snapshot or a log record are CheckpointCorrupt."""
    store, runs = journal_run(tmp_path)
    (runs / "r1.lock").write_bytes(b"")
    log = runs / "r1.1.log"
    good_log = log.read_bytes()
    payload = b'{"seq":4,"set":{"summary":' + nested(100_000) + b"}}"
    log.write_bytes(good_log + framedlog.frame(payload))
    with pytest.raises(durably.CheckpointCorrupt, match="nested too deeply"):
        store.read_sync("r1")
    log.write_bytes(good_log)
    body = b'{"run_id":"r1","task":"t","created_at":"2025-01-01T00:00:00Z","summary":'
    snapshot = FileStore(tmp_path / "snap")
    snapshot.create_sync(a_state()).close_sync()
    state_bytes = body + nested(100_000) + b"}"
    envelope = b'{"durably":1,"crc32":%d,"state":%s}' % (zlib.crc32(state_bytes), state_bytes)
    (tmp_path / "snap" / "r1.json").write_bytes(envelope)
    with pytest.raises(durably.CheckpointCorrupt, match="nested too deeply"):
        snapshot.read_sync("r1")


@pytest.mark.parametrize("name", ["r1.json", "r1.1.log", "r1.lock"])
def test_a_fifo_in_the_store_is_refused_without_blocking(tmp_path: Path, name: str) -> None:
    """A FIFO at a checkpoint, log or lock path is refused at once (the test would hang else)."""
    store, runs = journal_run(tmp_path)
    (runs / name).unlink()
    os.mkfifo(runs / name, 0o600)
    with pytest.raises(durably.UnsafePath, match="a FIFO"):
        store.open_sync("r1")
    if name != "r1.lock":
        with pytest.raises(durably.UnsafePath, match="a FIFO"):
            store.read_sync("r1")


@pytest.mark.parametrize("name", ["r1.1.log", "r1.lock"])
def test_a_directory_where_a_store_file_should_be_is_a_clear_error(
    tmp_path: Path, name: str
) -> None:
    """A directory at a log or lock path is UnsafePath, not a raw IsADirectoryError."""
    store, runs = journal_run(tmp_path)
    (runs / name).unlink()
    (runs / name).mkdir()
    with pytest.raises(durably.UnsafePath, match="directory"):
        store.open_sync("r1")


@pytest.mark.parametrize(
    "field", ["resumes", "turns", "dollars", "usage.input_tokens", "summarized"]
)
def test_checksum_valid_negative_counts_are_corrupt(tmp_path: Path, field: str) -> None:
    """A snapshot or log record with a negative count or amount is CheckpointCorrupt on load."""
    state = a_state()
    if field.startswith("usage."):
        state.usage = durably.Usage(input_tokens=-1)
    else:
        setattr(state, field, -1.0 if field == "dollars" else -1)
    runs = tmp_path / "runs"
    FileStore(runs).create_sync(a_state()).close_sync()
    (runs / "r1.json").write_bytes(seal(state))
    with pytest.raises(durably.CheckpointCorrupt, match=r"below zero|not a sum spent"):
        FileStore(runs).read_sync("r1")

    store, jruns = journal_run(tmp_path / "j")
    (jruns / "r1.lock").write_bytes(b"")
    top = field.split(".")[0]
    value = msgspec.json.encode(getattr(state, top))
    payload = b'{"seq":4,"set":{"%s":%s}}' % (top.encode(), value)
    with (jruns / "r1.1.log").open("ab") as log:
        log.write(framedlog.frame(payload))
    with pytest.raises(durably.CheckpointCorrupt, match=r"below zero|not a sum spent"):
        store.read_sync("r1")


def test_reading_from_a_state_directory_that_does_not_exist_creates_nothing(
    tmp_path: Path,
) -> None:
    """A reader's missing state directory is RunNotFound, and no directory is made."""
    with pytest.raises(durably.RunNotFound):
        JournalStore(tmp_path / "no" / "such" / "runs").read_sync("r1")
    assert list(tmp_path.iterdir()) == []


# -- 13: a lock file deleted while held ---------------------------------------------------


@pytest.mark.parametrize("store_class", STORES)
def test_a_lock_file_deleted_while_held_stops_the_owner(
    tmp_path: Path, store_class: type[FileStore]
) -> None:
    """After its lock file is deleted, the owner's next save raises LockLost and writes nothing,
    so a second owner that got in is never overwritten.
    """
    runs = tmp_path / "runs"
    store = store_class(runs)
    state = a_state()
    first = store.create_sync(state)
    (runs / "r1.lock").unlink()  # a tmp cleaner
    second, theirs = store_class(runs).open_sync("r1")
    grow(theirs, 1)
    second.save_sync(theirs)
    grow(state, 7)
    with pytest.raises(durably.LockLost, match="deleted or replaced"):
        first.save_sync(state)
    with pytest.raises(durably.SaveFailed):
        first.save_sync(state)  # the handle stays stopped
    first.close_sync()
    second.close_sync()
    assert store_class(runs).read_sync("r1").turns == 1


def test_a_reader_beside_a_saving_owner_never_sees_a_false_corruption(tmp_path: Path) -> None:
    """``read`` (no lock) while the owner appends and compacts gets saved states, never a
    CheckpointCorrupt from a watermark newer than the log it read.
    """
    store = JournalStore(tmp_path / "runs", sync=False, compact_min_bytes=0, compact_ratio=0.3)
    state = a_state()
    handle = store.create_sync(state)
    stop = threading.Event()
    errors: list[BaseException] = []

    def owner() -> None:
        try:
            n = 0
            while not stop.is_set():
                n += 1
                state.turns = n  # a small record each time; a compaction every few
                handle.save_sync(state)
        except BaseException as exc:  # noqa: BLE001 - the writer thread's error, whatever it is, is asserted on
            errors.append(exc)

    writer = threading.Thread(target=owner)
    writer.start()
    reader = JournalStore(tmp_path / "runs")
    try:
        for _ in range(150):
            reader.read_sync("r1")
    finally:
        stop.set()
        writer.join()
        handle.close_sync()
    assert errors == []
