"""A thread file cannot choose what code runs when it is read (issue 31, item 6).

LangGraph's serializer records, for a value of a class, the module and name to rebuild
it with; its own default then imports and calls whatever a record names. A record
naming ``os.system`` would run a command as the user reading the thread. DurablySaver's
default rebuilds only LangGraph's safe list (LangChain's messages among them), and an
application widens it by name.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import ormsgpack
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.serde.jsonplus import EXT_CONSTRUCTOR_SINGLE_ARG, JsonPlusSerializer

from durably.langgraph import DurablySaver


@dataclasses.dataclass
class Order:
    """An application's own state type, which it allows by name."""

    number: str
    cents: int


class Forger(JsonPlusSerializer):
    """Writes, for the string "FORGED", a record naming ``os.system`` with a command."""

    def __init__(self, command: str) -> None:
        super().__init__(allowed_msgpack_modules=True)
        self.command = command

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        """The forged record for "FORGED", LangGraph's encoding for anything else."""
        if obj == "FORGED":
            call = ormsgpack.packb(["os", "system", self.command])
            return "msgpack", ormsgpack.packb(ormsgpack.Ext(EXT_CONSTRUCTOR_SINGLE_ARG, call))
        return super().dumps_typed(obj)


def put(saver: DurablySaver, thread: str, value: Any) -> None:
    """Save one checkpoint whose only channel holds ``value``."""
    checkpoint = {
        "v": 1,
        "id": "1",
        "ts": "2026-01-01T00:00:00+00:00",
        "channel_values": {"x": value},
        "channel_versions": {"x": "1"},
        "versions_seen": {},
        "updated_channels": None,
    }
    config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    saver.put(config, checkpoint, {"source": "loop", "step": 1, "parents": {}}, {"x": "1"})  # type: ignore[arg-type]


def read(saver: DurablySaver, thread: str) -> Any:
    """The channel's value in the thread's latest checkpoint."""
    found = saver.get_tuple({"configurable": {"thread_id": thread}})
    assert found is not None
    return found.checkpoint["channel_values"]["x"]


def test_a_record_naming_os_system_runs_nothing_when_the_thread_is_read(tmp_path: Path) -> None:
    """The forged record comes back as its raw argument; the command never ran."""
    ran = tmp_path / "ran"
    with DurablySaver(tmp_path / "threads", serde=Forger(f"touch {ran}")) as forger:
        put(forger, "t", "FORGED")
    with DurablySaver(tmp_path / "threads") as reader:
        assert read(reader, "t") == f"touch {ran}"
    assert not ran.exists()


def test_langchains_messages_still_round_trip(tmp_path: Path) -> None:
    """The safe list covers what a chat graph's state holds."""
    messages = [
        HumanMessage("refund order 1042"),
        AIMessage("", tool_calls=[{"id": "c1", "name": "refund", "args": {"order": "1042"}}]),
        ToolMessage("refunded", tool_call_id="c1"),
    ]
    with DurablySaver(tmp_path) as saver:
        put(saver, "t", messages)
        assert read(saver, "t") == messages


def test_an_application_widens_the_list_by_name(tmp_path: Path) -> None:
    """Its own types are rebuilt once allowed; not before (they come back as raw fields)."""
    with DurablySaver(tmp_path, allowed_msgpack_modules=[Order]) as saver:
        put(saver, "t", Order("1042", 500))
        assert read(saver, "t") == Order("1042", 500)
    with DurablySaver(tmp_path) as strict:
        assert read(strict, "t") == {"number": "1042", "cents": 500}


def test_serde_and_an_allowlist_together_are_refused(tmp_path: Path) -> None:
    """Which of the two would win is not obvious, so neither is guessed."""
    with pytest.raises(TypeError, match="give serde= or allowed_msgpack_modules=, not both"):
        DurablySaver(tmp_path, serde=JsonPlusSerializer(), allowed_msgpack_modules=[Order])
