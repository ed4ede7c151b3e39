"""DurablySaver's edges: bad input, damaged files, odd thread IDs, two savers in one process."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from _lg_agent import build, question, summary

from durably import CheckpointCorrupt
from durably.langgraph import DurablySaver, ThreadLocked
from durably.langgraph._thread import thread_key


def _put(saver: DurablySaver, thread: str, cid: str, value: Any, parent: str | None = None) -> Any:
    config: dict[str, Any] = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    if parent:
        config["configurable"]["checkpoint_id"] = parent
    checkpoint = {
        "v": 1,
        "id": cid,
        "ts": "2026-01-01T00:00:00+00:00",
        "channel_values": {"x": value},
        "channel_versions": {"x": cid},
        "versions_seen": {},
        "updated_channels": None,
    }
    metadata = {"source": "loop", "step": int(cid), "parents": {}}
    return saver.put(config, checkpoint, metadata, {"x": cid})  # type: ignore[arg-type]


def _latest(saver: DurablySaver, thread: str) -> Any:
    found = saver.get_tuple({"configurable": {"thread_id": thread}})
    return None if found is None else found.checkpoint["channel_values"]["x"]


def test_an_unknown_prune_strategy_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    """``prune`` with a strategy LangGraph does not define raises, naming the ones it does."""
    with DurablySaver(tmp_path) as saver:
        _put(saver, "t", "1", "a")
        with pytest.raises(ValueError, match="'keep_oldest' is not known; use one of keep_latest"):
            saver.prune(["t"], strategy="keep_oldest")
        assert _latest(saver, "t") == "a"


def test_a_second_saver_in_the_same_process_is_refused_too(tmp_path: Path) -> None:
    """Two savers on one directory exclude each other per thread, as two processes do."""
    with DurablySaver(tmp_path) as first, DurablySaver(tmp_path) as second:
        _put(first, "t", "1", "a")
        with pytest.raises(ThreadLocked, match="'t' is being written by another process"):
            _put(second, "t", "2", "b", parent="1")
        assert _latest(second, "t") == "a", "reading needs no lock"
        _put(second, "u", "1", "c")
        first.release("t")
        _put(second, "t", "2", "b", parent="1")
        assert _latest(first, "t") == "b"


def test_a_torn_last_record_is_cut_off_and_the_thread_goes_on(tmp_path: Path) -> None:
    """A half-written last record (never acknowledged) is ignored, then cut by the next writer."""
    with DurablySaver(tmp_path) as saver:
        _put(saver, "t", "1", "a")
        _put(saver, "t", "2", "b", parent="1")
    log = tmp_path / "t.1.log"
    whole = log.read_bytes()
    with DurablySaver(tmp_path) as saver:
        _put(saver, "t", "3", "c" * 100, parent="2")
    log.write_bytes(log.read_bytes()[: len(whole) + 30])  # the third put, torn
    with DurablySaver(tmp_path) as saver:
        assert _latest(saver, "t") == "b"
        _put(saver, "t", "3", "d", parent="2")
        assert _latest(saver, "t") == "d"
    with DurablySaver(tmp_path) as saver:
        assert _latest(saver, "t") == "d"


def test_a_damaged_record_with_records_after_it_is_corrupt(tmp_path: Path) -> None:
    """A bad record followed by good ones is CheckpointCorrupt naming the file, never skipped."""
    with DurablySaver(tmp_path) as saver:
        for n in range(1, 4):
            _put(saver, "t", str(n), "v" * 50, parent=str(n - 1) if n > 1 else None)
    log = tmp_path / "t.1.log"
    data = bytearray(log.read_bytes())
    data[len(data) // 2] ^= 0xFF
    log.write_bytes(bytes(data))
    with DurablySaver(tmp_path) as saver, pytest.raises(CheckpointCorrupt, match=r"t\.1\.log"):
        saver.get_tuple({"configurable": {"thread_id": "t"}})


@pytest.mark.parametrize("thread", ["user/42", "ünïcode thread", "a.b", "x" * 300, ""])
def test_any_thread_id_gets_its_own_files_and_lists_back(tmp_path: Path, thread: str) -> None:
    """Thread IDs that are not safe file names are stored under a digest and listed as given."""
    with DurablySaver(tmp_path) as saver:
        _put(saver, thread, "1", "a")
        _put(saver, "plain", "1", "b")
        assert _latest(saver, thread) == "a"
        listed = {t.config["configurable"]["thread_id"] for t in saver.list(None)}
        assert listed == {thread, "plain"}
    assert (tmp_path / f"{thread_key(thread)}.json").exists()
    assert thread_key(thread).startswith("x.")


def test_an_async_graph_saves_what_a_sync_saver_reads_back(tmp_path: Path) -> None:
    """``ainvoke`` saves through the async methods; a sync saver on the same files reads the run."""
    config: Any = {"configurable": {"thread_id": "async"}, "recursion_limit": 100}

    async def run() -> Any:
        async with DurablySaver(tmp_path) as saver:
            return await build(saver, rounds=3).ainvoke(question(), config, durability="sync")

    final = asyncio.run(run())
    with DurablySaver(tmp_path) as saver:
        snapshot = build(saver, rounds=3).get_state(config)
    assert summary(snapshot.values["messages"]) == summary(final["messages"])
    assert len(final["messages"]) == 8
    assert snapshot.next == ()
