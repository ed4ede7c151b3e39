"""A thread's files as another user or a forger leaves them (issue 31, findings 6 and 10).

The header is opened as the stores open theirs (never blocking, only a regular file
of ours), and a value naming a type outside the saver's allowlist is refused on read,
never constructed: a thread file cannot run code.
"""

from __future__ import annotations

import importlib
import os
import pwd
import threading
from pathlib import Path
from typing import Any

import ormsgpack
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.serde.jsonplus import EXT_CONSTRUCTOR_POS_ARGS, JsonPlusSerializer

from _helpers.patience import stretched
from durably import UnsafePath
from durably.langgraph import DurablySaver, ThreadValueRefused

THREAD: RunnableConfig = {"configurable": {"thread_id": "t"}}

MARKER_MODULE = """\
from pathlib import Path


class Planted:
    def __init__(self, path):
        Path(path).write_text("ran")


def touch(path):
    Path(path).write_text("ran")
"""


def _put(saver: DurablySaver, value: Any) -> None:
    checkpoint = {
        "v": 1,
        "id": "1",
        "ts": "2026-01-01T00:00:00+00:00",
        "channel_values": {"x": value},
        "channel_versions": {"x": "1"},
        "versions_seen": {},
        "updated_channels": None,
    }
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    saver.put(config, checkpoint, {"step": 1}, {"x": "1"})  # type: ignore[arg-type]


def _read(directory: Path, **options: Any) -> Any:
    with DurablySaver(directory, **options) as saver:
        found = saver.get_tuple(THREAD)
    assert found is not None
    return found.checkpoint["channel_values"]["x"]


class _Forger(JsonPlusSerializer):
    """Writes the value ``"FORGE"`` as a msgpack constructor call of ``call`` with ``args``."""

    def __init__(self, call: tuple[str, str], args: list[Any]) -> None:
        super().__init__()
        self.call, self.args = call, args

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        if obj == "FORGE":
            payload = ormsgpack.packb([*self.call, self.args])
            return "msgpack", ormsgpack.packb(ormsgpack.Ext(EXT_CONSTRUCTOR_POS_ARGS, payload))
        return super().dumps_typed(obj)


@pytest.fixture
def marker_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An importable module whose function and class leave a file behind when called."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "durably_marker31.py").write_text(MARKER_MODULE)
    monkeypatch.syspath_prepend(str(code))
    return tmp_path / "ran"


@pytest.mark.parametrize(
    "call", [("os", "system"), ("durably_marker31", "touch"), ("durably_marker31", "Planted")]
)
def test_a_forged_value_naming_a_callable_is_refused_not_run(
    tmp_path: Path, marker_module: Path, call: tuple[str, str]
) -> None:
    """A thread value that names a function or class outside the allowlist is not called on
    read (no file appears) and the read fails naming the type and how to allow it.
    """
    threads = tmp_path / "threads"
    argument = f"touch {marker_module}" if call == ("os", "system") else str(marker_module)
    with DurablySaver(threads, serde=_Forger(call, [argument])) as saver:
        _put(saver, "FORGE")
    with pytest.raises(ThreadValueRefused) as refused:
        _read(threads)
    assert not marker_module.exists(), "the forged record ran code"
    message = str(refused.value)
    assert f"{call[0]}.{call[1]}" in message
    assert "thread 't'" in message
    assert f"allowed_types=[({call[0]!r}, {call[1]!r})]" in message


def test_langchain_messages_round_trip_with_the_default_allowlist(tmp_path: Path) -> None:
    """The messages an agent's state holds are on the default allowlist and read back equal."""
    messages = [
        HumanMessage("refund order 7"),
        AIMessage("", tool_calls=[{"name": "refund", "args": {"order": 7}, "id": "c1"}]),
        ToolMessage("refunded", tool_call_id="c1"),
        AIMessage("done"),
    ]
    with DurablySaver(tmp_path) as saver:
        _put(saver, messages)
    assert _read(tmp_path) == messages


def test_an_application_widens_the_allowlist_explicitly(
    tmp_path: Path, marker_module: Path
) -> None:
    """A type the application names in ``allowed_types`` is constructed on read, as it asked;
    the same record read with the default allowlist is refused.
    """
    planted = importlib.import_module("durably_marker31").Planted
    forger = _Forger(("durably_marker31", "Planted"), [str(marker_module)])
    with DurablySaver(tmp_path, serde=forger) as saver:
        _put(saver, "FORGE")
    with pytest.raises(ThreadValueRefused):
        _read(tmp_path)
    assert not marker_module.exists()
    value = _read(tmp_path, allowed_types=[planted])
    assert isinstance(value, planted)
    assert marker_module.read_text() == "ran"


def test_a_fifo_at_the_header_is_refused_at_once(tmp_path: Path) -> None:
    """A FIFO planted at a thread's header name is refused, not waited on for a writer."""
    os.mkfifo(tmp_path / "t.json", 0o600)
    outcome: list[BaseException | None] = []

    def read() -> None:
        try:
            with DurablySaver(tmp_path) as saver:
                saver.get_tuple(THREAD)
        except BaseException as exc:  # noqa: BLE001 - the thread's outcome, whatever it is, is what the test asserts
            outcome.append(exc)
        else:
            outcome.append(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=stretched(60))
    if reader.is_alive():
        # Free the blocked open (a writer end) so the thread ends, then fail.
        os.close(os.open(tmp_path / "t.json", os.O_WRONLY | os.O_NONBLOCK))
        reader.join(timeout=stretched(10))
        pytest.fail("get_tuple blocked on a FIFO at the thread's header")
    (error,) = outcome
    assert isinstance(error, UnsafePath), error
    assert "t.json" in str(error)
    assert "FIFO" in str(error)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_a_header_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    """A 0666 header another user owns is UnsafePath naming its owner and mode, not read."""
    with DurablySaver(tmp_path) as saver:
        _put(saver, "mine")
    header = tmp_path / "t.json"
    nobody = pwd.getpwnam("nobody")
    os.chown(header, nobody.pw_uid, nobody.pw_gid)
    header.chmod(0o666)
    with pytest.raises(UnsafePath, match=r"t\.json: it is owned by uid .*nobody.* mode 0666"):
        _read(tmp_path)
    with DurablySaver(tmp_path) as saver, pytest.raises(UnsafePath, match=r"t\.json"):
        _put(saver, "again")


@pytest.mark.postgres
def test_a_forged_value_in_a_postgres_thread_is_refused_not_run(
    pg_dsn: str, marker_module: Path
) -> None:
    """PostgresThreadSaver reads through the same allowlist refusal: the forged class is not
    built (no file appears) and the read fails naming the type, not with a value swapped in.
    """
    from durably.langgraph import PostgresThreadSaver

    forger = _Forger(("durably_marker31", "Planted"), [str(marker_module)])
    with PostgresThreadSaver(pg_dsn, serde=forger) as saver:
        _put(saver, "FORGE")  # type: ignore[arg-type]
    with PostgresThreadSaver(pg_dsn) as saver, pytest.raises(ThreadValueRefused) as refused:
        saver.get_tuple(THREAD)
    assert not marker_module.exists(), "the forged record ran code"
    assert "durably_marker31.Planted" in str(refused.value)
    assert "thread 't'" in str(refused.value)
