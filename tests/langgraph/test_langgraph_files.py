"""A thread's files: the log's reserved space, the header's checksum, a log gone missing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig

from durably import CheckpointCorrupt
from durably._sysio import filesystem_type
from durably.langgraph import DurablySaver
from durably.langgraph._thread import records

THREAD: RunnableConfig = {"configurable": {"thread_id": "t"}}


def _put(saver: DurablySaver, cid: int, value: Any) -> None:
    config: dict[str, Any] = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    if cid > 1:
        config["configurable"]["checkpoint_id"] = str(cid - 1)
    checkpoint = {
        "v": 1,
        "id": str(cid),
        "ts": "2026-01-01T00:00:00+00:00",
        "channel_values": {"x": value},
        "channel_versions": {"x": str(cid)},
        "versions_seen": {},
        "updated_channels": None,
    }
    saver.put(config, checkpoint, {"step": cid}, {"x": str(cid)})  # type: ignore[arg-type]


def _latest(directory: Path) -> Any:
    with DurablySaver(directory) as saver:
        found = saver.get_tuple(THREAD)
    return None if found is None else found.checkpoint["channel_values"]["x"]


def _records_end(data: bytes) -> int:
    return max((end for _, end in records(data, path="log")), default=0)


@pytest.fixture
def reserving(tmp_path: Path) -> Path:
    """A directory on a file system where the saver reserves log space (the CI's ext4)."""
    if filesystem_type(tmp_path) not in ("ext4", "xfs"):
        pytest.skip(f"the saver reserves space on ext4 and xfs, not {filesystem_type(tmp_path)}")
    return tmp_path


def test_reserved_space_reads_as_the_end_of_the_log_and_is_given_back(reserving: Path) -> None:
    """The zeros reserved past the last record end the log for readers and are cut on release."""
    live, crashed = reserving / "live", reserving / "crashed"
    saver = DurablySaver(live)
    for n in range(1, 4):
        _put(saver, n, f"v{n}")
    data = (live / "t.1.log").read_bytes()
    end = _records_end(data)
    assert len(data) - end > 15_000, "the owner reserves space ahead of the log's end"
    assert data[end:] == bytes(len(data) - end)
    assert _latest(live) == "v3", "a reader stops at the reserved zeros"

    shutil.copytree(live, crashed)  # the files as a SIGKILLed owner leaves them
    saver.close()
    assert (live / "t.1.log").stat().st_size == end, "closing gives the reserved space back"

    with DurablySaver(crashed) as saver:
        _put(saver, 4, "v4")
    data = (crashed / "t.1.log").read_bytes()
    assert _records_end(data) == len(data), "the next owner wrote right after the last record"
    assert _latest(crashed) == "v4"


def test_a_damaged_record_is_told_from_a_torn_one_before_reserved_space(reserving: Path) -> None:
    """Before reserved zeros, a bad last record is torn; a bad one before another is corrupt."""
    saver = DurablySaver(reserving / "threads")
    for n in range(1, 4):
        _put(saver, n, "v" * 50 + str(n))
    data = (reserving / "threads" / "t.1.log").read_bytes()
    saver.close()
    last = [start for start, _ in _spans(data)][-1]

    torn = bytearray(data)
    torn[last + 20] ^= 0xFF
    damaged = bytearray(data)
    damaged[last - 20] ^= 0xFF
    for name, image in (("torn", torn), ("damaged", damaged)):
        (reserving / name).mkdir()
        shutil.copy(reserving / "threads" / "t.json", reserving / name)
        shutil.copy(reserving / "threads" / "t.1.wlog", reserving / name)
        (reserving / name / "t.1.log").write_bytes(bytes(image) + bytes(16 << 10))
    assert _latest(reserving / "torn") == "v" * 50 + "2"
    with pytest.raises(CheckpointCorrupt, match="a damaged record at byte"):
        _latest(reserving / "damaged")


def _spans(data: bytes) -> list[tuple[int, int]]:
    spans, start = [], 0
    for _, end in records(data, path="log"):
        spans.append((start, end))
        start = end
    return spans


def test_a_header_whose_generation_was_altered_is_corrupt(tmp_path: Path) -> None:
    """The header's checksum covers its generation: a changed one is refused, not followed."""
    with DurablySaver(tmp_path) as saver:
        _put(saver, 1, "a")
        saver.prune(["t"])  # generation 2: generation 1's log is gone
    header = json.loads((tmp_path / "t.json").read_bytes())
    assert header["generation"] == 2
    (tmp_path / "t.json").write_text(json.dumps({**header, "generation": 3}))
    with pytest.raises(CheckpointCorrupt, match="checksum does not match"):
        _latest(tmp_path)


def test_a_version_1_header_without_a_checksum_still_reads(tmp_path: Path) -> None:
    """A header written before the checksum existed (format 1) is read and written over."""
    with DurablySaver(tmp_path) as saver:
        _put(saver, 1, "a")
    (tmp_path / "t.json").write_text('{"format":1,"thread_id":"t","generation":1}')
    assert _latest(tmp_path) == "a"
    with DurablySaver(tmp_path) as saver:
        _put(saver, 2, "b")
        saver.prune(["t"])
    assert json.loads((tmp_path / "t.json").read_bytes())["format"] == 3
    assert _latest(tmp_path) == "b"


def test_a_header_naming_a_missing_log_is_corrupt(tmp_path: Path) -> None:
    """A log deleted from under its header is CheckpointCorrupt, never an empty thread."""
    with DurablySaver(tmp_path) as saver:
        _put(saver, 1, "a")
    (tmp_path / "t.1.log").unlink()
    with pytest.raises(CheckpointCorrupt, match=r"t\.1\.log.*names this log and it is missing"):
        _latest(tmp_path)
    with DurablySaver(tmp_path) as saver, pytest.raises(CheckpointCorrupt, match="missing"):
        _put(saver, 2, "b")
