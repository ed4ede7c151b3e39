"""The pending writes' own log (format 3).

A put does not wait for it, damage in it is told from a torn tail, and threads
written before it (format 2) still read and go on.
"""

from __future__ import annotations

import json
import operator
import shutil
import threading
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from _lg_agent import build
from _lg_calls import put, put_writes
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph

from durably import CheckpointCorrupt
from durably._sysio import FileSystem
from durably.langgraph import DurablySaver
from durably.langgraph._thread import records

FORMAT2 = Path(__file__).resolve().parent.parent / "testdata" / "langgraph-format2"
THREAD: RunnableConfig = {"configurable": {"thread_id": "t"}}


def _writes(directory: Path, cid: int) -> list[tuple[str, str, Any]]:
    with DurablySaver(directory) as saver:
        config: Any = {"configurable": {"thread_id": "t", "checkpoint_id": f"{cid:04d}"}}
        found = saver.get_tuple(config)
    assert found is not None
    return list(found.pending_writes or [])


class HeldWrites(FileSystem):
    """Holds every write to a writes log (``*.wlog``) until ``go`` is set, once ``hold`` is."""

    def __init__(self) -> None:
        super().__init__()
        self.wlogs: set[int] = set()
        self.hold = threading.Event()
        self.held = threading.Event()
        self.go = threading.Event()

    def open(self, name: str, flags: int, mode: int, *, dir_fd: int) -> int:
        """Open, noting whether the descriptor is a writes log's."""
        fd = super().open(name, flags, mode, dir_fd=dir_fd)
        (self.wlogs.add if name.endswith(".wlog") else self.wlogs.discard)(fd)
        return fd

    def write(self, fd: int, data: bytes) -> None:
        """Write, after waiting for ``go`` if this is a held writes log's."""
        if fd in self.wlogs and self.hold.is_set():
            self.held.set()
            assert self.go.wait(10), "the held write was never let go"
        super().write(fd, data)


def test_a_put_completes_while_the_steps_writes_are_still_being_flushed(tmp_path: Path) -> None:
    """A put does not wait for a put_writes' flush, and close waits for that flush to finish."""
    fs = HeldWrites()
    saver = DurablySaver(tmp_path, fs=fs)
    put(saver, 1)
    put_writes(saver, 1, "a")  # creates the writes log (under the saver's lock)
    fs.hold.set()
    writer = threading.Thread(target=put_writes, args=(saver, 1, "b"))
    writer.start()
    assert fs.held.wait(10)
    put(saver, 2)  # with the old one-lock saver this blocks until the writes are let go
    first = saver.get_tuple({"configurable": {"thread_id": "t", "checkpoint_id": "0001"}})
    assert first is not None
    assert [w[0] for w in first.pending_writes or []] == ["a"]  # "b" is not acknowledged yet
    closer = threading.Thread(target=saver.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive(), "close did not wait for the write in flight"
    fs.go.set()
    writer.join(10)
    closer.join(10)
    assert not writer.is_alive()
    assert not closer.is_alive()
    assert [w[0] for w in _writes(tmp_path, 1)] == ["a", "b"]
    assert _writes(tmp_path, 2) == []


def test_a_torn_last_writes_record_is_cut_and_damage_before_a_whole_one_is_corrupt(
    tmp_path: Path,
) -> None:
    """The writes log keeps the log's rule: a torn tail was never acknowledged; a hole is damage."""
    with DurablySaver(tmp_path) as saver:
        put(saver, 1)
        for task in ("a", "b", "c"):
            put_writes(saver, 1, task)
    wlog = tmp_path / "t.1.wlog"
    data = wlog.read_bytes()
    ends = [end for _, end in records(data, path="wlog")]
    assert len(ends) == 3
    torn = tmp_path / "torn"
    shutil.copytree(tmp_path, torn)
    (torn / "t.1.wlog").write_bytes(data[: ends[1] + 5])
    assert [w[0] for w in _writes(torn, 1)] == ["a", "b"]
    with DurablySaver(torn) as saver:
        put_writes(saver, 1, "d")  # the claim cut the torn tail: the next record follows "b"
    assert [w[0] for w in _writes(torn, 1)] == ["a", "b", "d"]
    damaged = tmp_path / "damaged"
    shutil.copytree(tmp_path, damaged, ignore=shutil.ignore_patterns("torn", "damaged"))
    broken = bytearray(data)
    broken[ends[0] + 10] ^= 0xFF
    (damaged / "t.1.wlog").write_bytes(bytes(broken))
    with pytest.raises(CheckpointCorrupt):
        _writes(damaged, 1)


def test_a_missing_writes_log_is_corrupt_when_read_and_when_claimed(tmp_path: Path) -> None:
    """The writes log is made with its generation: one gone missing is damage, not "no writes"."""
    with DurablySaver(tmp_path) as saver:
        put(saver, 1)
    assert (tmp_path / "t.1.wlog").read_bytes() == b""  # made empty with the log
    (tmp_path / "t.1.wlog").unlink()
    with pytest.raises(CheckpointCorrupt, match=r"t\.1\.wlog"):
        _writes(tmp_path, 1)
    with DurablySaver(tmp_path) as saver, pytest.raises(CheckpointCorrupt, match="missing"):
        put_writes(saver, 1, "a")


def test_a_format_2_thread_reads_goes_on_in_one_log_and_a_prune_makes_it_format_3(
    tmp_path: Path,
) -> None:
    """A format 2 thread reads as written, goes on in its one log, and a prune makes it format 3."""
    directory = tmp_path / "threads"
    shutil.copytree(FORMAT2 / "threads", directory)
    expected = json.loads((FORMAT2 / "expected.json").read_text())
    config: RunnableConfig = {"configurable": {"thread_id": "old"}}
    with DurablySaver(directory) as saver:
        found = {
            t.checkpoint["id"]: {
                "messages": len(t.checkpoint["channel_values"].get("messages", [])),
                "writes": sorted([task, channel] for task, channel, _ in t.pending_writes or []),
            }
            for t in saver.list(config)
        }
        assert found == expected
        before = len(expected)
        build(saver, rounds=3).invoke(
            {"messages": [HumanMessage("again")]}, config, durability="sync"
        )
        assert len(list(saver.list(config))) > before
    assert json.loads((directory / "old.json").read_text())["format"] == 2
    assert not list(directory.glob("*.wlog"))
    with DurablySaver(directory) as saver:
        latest = saver.get_tuple(config)
        assert latest is not None
        saver.prune(["old"])
        build(saver, rounds=4).invoke(
            {"messages": [HumanMessage("more")]}, config, durability="sync"
        )
        final = saver.get_tuple(config)
    assert json.loads((directory / "old.json").read_text())["format"] == 3
    assert list(directory.glob("old.*.wlog"))
    with DurablySaver(directory) as saver:
        again = saver.get_tuple(config)
    assert final is not None
    assert again is not None
    assert again.checkpoint["id"] == final.checkpoint["id"]
    messages = again.checkpoint["channel_values"]["messages"]
    assert len(messages) > len(latest.checkpoint["channel_values"]["messages"])


class FanState(TypedDict):
    """The fan-out graph's state: what each task saw."""

    seen: Annotated[list[str], operator.add]


def _fan_out(saver: Any) -> Any:
    """A graph whose every superstep runs four tasks at once, each writing (20 supersteps)."""
    names = ["a", "b", "c", "d"]

    def node(name: str) -> Any:
        def run(state: FanState) -> dict[str, list[str]]:
            return {"seen": [f"{name}{len(state['seen'])}"]}

        return run

    def again(state: FanState) -> list[str] | str:
        return names if len(state["seen"]) < 100 else END

    graph = StateGraph(FanState)
    for name in names:
        graph.add_node(name, node(name))
        graph.add_edge(START, name)
    graph.add_node("join", lambda state: {"seen": ["j"]})
    graph.add_edge(names, "join")
    graph.add_conditional_edges("join", again, [*names, END])
    return graph.compile(checkpointer=saver)


def test_parallel_tasks_writes_all_land_and_read_back_as_an_in_memory_saver_has_them(
    tmp_path: Path,
) -> None:
    """Four tasks a step saving writes at once, beside the step's put, lose and mix up nothing."""
    config: RunnableConfig = {"configurable": {"thread_id": "t"}, "recursion_limit": 1000}
    reference = InMemorySaver()
    _fan_out(reference).invoke({"seen": []}, config, durability="sync")
    with DurablySaver(tmp_path) as saver:
        _fan_out(saver).invoke({"seen": []}, config, durability="sync")
    assert list(tmp_path.glob("t.1.wlog"))

    def shape(saver: Any) -> list[tuple[int, list[tuple[str, Any]]]]:
        return [
            (
                len(found.checkpoint["channel_values"].get("seen", [])),
                sorted((channel, repr(value)) for _, channel, value in found.pending_writes or []),
            )
            for found in saver.list(config)
        ]

    with DurablySaver(tmp_path) as reread:
        assert shape(reread) == shape(reference)
        assert len(shape(reread)) > 40
