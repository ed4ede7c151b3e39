"""DurablySaver stores O(change): the channels that changed, and of a grown list only its tail."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _lg_agent import build, question, summary
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import Checkpoint
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from typing_extensions import override

from durably._sysio import FileSystem
from durably.langgraph import DurablySaver
from durably.langgraph._thread import Put, records, thread_key

ROUNDS = 100  # 2 supersteps a round: a 200-step graph


class CountingFS(FileSystem):
    """The real file system, counting the bytes passed to write()."""

    def __init__(self) -> None:
        self.written = 0

    @override
    def write(self, fd: int, data: bytes) -> None:
        self.written += len(data)
        super().write(fd, data)


class Spy(DurablySaver):
    """A DurablySaver recording, per put, the bytes it wrote and what LangGraph handed it."""

    def __init__(self, directory: Path, fs: CountingFS) -> None:
        super().__init__(directory, sync=False, fs=fs)
        self.counting = fs
        self.puts: list[tuple[int, list[str], int]] = []
        """(bytes written, channels in new_versions, length of the messages list)."""
        self.whole = 0
        """What storing every changed channel whole would have written (serialized bytes)."""

    @override
    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        before = self.counting.written
        out = super().put(config, checkpoint, metadata, new_versions)
        values = checkpoint["channel_values"]
        self.puts.append(
            (self.counting.written - before, sorted(new_versions), len(values.get("messages", [])))
        )
        self.whole += sum(
            len(self.serde.dumps_typed(values[c])[1]) for c in new_versions if c in values
        )
        return out

    @override
    def put_writes(
        self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        super().put_writes(config, writes, task_id, task_path)


def test_a_200_step_graph_writes_only_what_each_step_changed(tmp_path: Path) -> None:
    """Over a 200-step agent run, each put writes the changed channels and only the new messages."""
    directory = tmp_path / "threads"
    config = {"configurable": {"thread_id": "agent-1"}, "recursion_limit": 1000}
    with Spy(directory, CountingFS()) as saver:
        final = build(saver, rounds=ROUNDS).invoke(question(), config, durability="sync")
    messages = final["messages"]
    assert len(messages) == 2 * ROUNDS + 2
    assert len(saver.puts) >= 2 * ROUNDS

    # Only the channels in new_versions were written, each put in one record.
    log = (directory / f"{thread_key('agent-1')}.1.log").read_bytes()
    puts = [r for r, _ in records(log, path="log") if isinstance(r, Put)]
    assert [sorted(b.channel for b in p.blobs) for p in puts] == [p[1] for p in saver.puts]

    # A grown messages list stored only its new items: one or two messages, never the history.
    serde = JsonPlusSerializer()
    grown = 0
    for put, (_, _, length) in zip(puts[1:], saver.puts[1:], strict=True):
        for blob in put.blobs:
            if blob.channel == "messages" and length > 1:
                assert blob.base, "a list that grew was stored whole"
                added = serde.loads_typed((blob.type, blob.data))
                assert 1 <= len(added) <= 2
                grown += 1
    assert grown >= 2 * ROUNDS - 1

    # So the bytes per step stay flat while the conversation grows a hundredfold.
    sizes = [written for written, _, _ in saver.puts]
    early, late = sizes[2:52], sizes[-50:]
    assert statistics.median(late) <= 1.2 * statistics.median(early), (early, late)
    # The largest late step may hold two steps' records when LangGraph's writer thread
    # flushes them together (seen once in a loaded full run: 3,350 bytes against 1,943);
    # a step storing the history would be about a hundred times the early ones.
    assert max(late) <= 2 * max(early)
    total = sum(sizes)
    assert total <= 0.05 * saver.whole, (total, saver.whole)
    print(
        f"\n{len(sizes)} puts: {total} bytes written, median {statistics.median(sizes):.0f} "
        f"per put; storing each changed channel whole: {saver.whole} bytes "
        f"({total / saver.whole:.3f}x)"
    )


def test_reads_rebuild_every_checkpoint_of_the_run(tmp_path: Path) -> None:
    """Every checkpoint of a run reads back, through a second saver, with its whole message list."""
    directory = tmp_path / "threads"
    config = {"configurable": {"thread_id": "agent-2"}, "recursion_limit": 1000}
    with DurablySaver(directory, sync=False) as saver:
        final = build(saver, rounds=30).invoke(question(), config, durability="sync")
    expected = summary(final["messages"])
    with DurablySaver(directory) as reader:
        history = list(reader.list({"configurable": {"thread_id": "agent-2"}}))
        latest = reader.get_tuple({"configurable": {"thread_id": "agent-2"}})
    assert latest is not None
    assert summary(latest.checkpoint["channel_values"]["messages"]) == expected
    lengths = []
    for tup in history:
        listed = tup.checkpoint["channel_values"].get("messages", [])
        assert summary(listed) == expected[: len(listed)]
        lengths.append(len(listed))
    assert lengths == sorted(lengths, reverse=True)
    assert lengths[0] == len(expected)
    assert lengths[-1] == 0


def _put(
    saver: DurablySaver, parent: str | None, cid: str, messages: list[str], version: str
) -> None:
    config: RunnableConfig = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    if parent:
        config["configurable"]["checkpoint_id"] = parent
    checkpoint: Checkpoint = {
        "v": 1,
        "id": cid,
        "ts": "2026-01-01T00:00:00+00:00",
        "channel_values": {"messages": messages},
        "channel_versions": {"messages": version},
        "versions_seen": {},
        "updated_channels": None,
    }
    saver.put(
        config, checkpoint, {"source": "loop", "step": 0, "parents": {}}, {"messages": version}
    )


def _messages(saver: DurablySaver, cid: str) -> Any:
    tup = saver.get_tuple(
        {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": cid}}
    )
    assert tup is not None
    return tup.checkpoint["channel_values"]["messages"]


def test_a_list_that_was_rewritten_is_stored_whole_and_every_branch_reads_back(
    tmp_path: Path,
) -> None:
    """A list that does not extend the last one stored (a rewrite, a fork) is stored whole."""
    with DurablySaver(tmp_path / "threads", sync=False) as saver:
        _put(saver, None, "1", ["a", "b"], "1")
        _put(saver, "1", "2", ["a", "b", "c"], "2")  # extends: tail only
        _put(saver, "2", "3", ["summary"], "3")  # rewritten: whole
        _put(saver, "1", "4", ["a", "b", "x"], "4")  # a fork from checkpoint 1
        _put(saver, "4", "5", ["a", "b", "x", "y"], "5")
        log = next((tmp_path / "threads").glob("*.log")).read_bytes()
        bases = [p.blobs[0].base for p, _ in records(log, path="log") if isinstance(p, Put)]
        assert bases == [0, 1, 0, 0, 4]
        expected = {
            "1": ["a", "b"],
            "2": ["a", "b", "c"],
            "3": ["summary"],
            "4": ["a", "b", "x"],
            "5": ["a", "b", "x", "y"],
        }
        assert {cid: _messages(saver, cid) for cid in expected} == expected
        saver.prune(["t"], strategy="keep_latest")
        assert _messages(saver, "5") == ["a", "b", "x", "y"]
    with DurablySaver(tmp_path / "threads") as reopened:
        assert _messages(reopened, "5") == ["a", "b", "x", "y"]
