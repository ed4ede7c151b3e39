"""Runs written by older code load, carry on, and are not left readable as something else."""

from __future__ import annotations

import shutil
import zlib
from pathlib import Path

import msgspec
import pytest

import durably
from durably.checkpoint.envelope import open_sealed
from durably.state import RunState, ToolResult, encode_state
from durably.stores import journal
from durably.stores.file import FileStore
from durably.stores.journal import JournalStore

MAIN = Path(__file__).parent / "testdata" / "main-format"


def copied(kind: str, tmp_path: Path) -> Path:
    """The fixture directory ``kind`` copied with the modes a store trusts."""
    target = tmp_path / kind
    shutil.copytree(MAIN / kind, target)
    target.chmod(0o700)
    for path in target.iterdir():
        path.chmod(0o600)
    return target


def expected(run_id: str) -> RunState:
    """The state a fixture run must load as, from its ``.expected.json``."""
    return msgspec.json.decode((MAIN / f"{run_id}.expected.json").read_bytes(), type=RunState)


def envelope_version(path: Path) -> int:
    """The envelope version a snapshot file says it is."""
    version: int = msgspec.json.decode(path.read_bytes())["durably"]
    return version


def test_a_snapshot_run_written_by_main_loads_in_both_stores(tmp_path: Path) -> None:
    """A version-1 snapshot written by main's code reads as the state it saved."""
    runs = copied("snapshot", tmp_path)
    assert FileStore(runs).read_sync("snap-1") == expected("snap-1")
    assert JournalStore(runs).read_sync("snap-1") == expected("snap-1")


def test_a_journal_run_written_by_main_loads_and_carries_on(tmp_path: Path) -> None:
    """A version-2 snapshot and its log of whole-field records replay to the state main saved."""
    runs = copied("journal", tmp_path)
    store = JournalStore(runs)
    assert envelope_version(runs / "jour-1.json") == 2
    assert store.read_sync("jour-1") == expected("jour-1")
    handle, state = store.open_sync("jour-1")
    assert state == expected("jour-1")
    state.workspace.pop("f4.py")
    state.workspace["g.py"] = "c" * 64
    state.messages.append(ToolResult(call_id="c9", name="t", content="later"))
    handle.save_sync(state)  # compacts into version 3 before appending anything
    state.workspace["h.py"] = "d" * 64
    handle.save_sync(state)
    handle.close_sync()
    assert sorted(p.name for p in runs.iterdir()) == ["jour-1.2.log", "jour-1.json", "jour-1.lock"]
    assert envelope_version(runs / "jour-1.json") == 3
    assert store.read_sync("jour-1") == state
    assert b'"put":{"workspace":{"h.py"' in (runs / "jour-1.2.log").read_bytes()


def test_a_snapshot_store_run_written_by_main_carries_on_in_the_snapshot_store(
    tmp_path: Path,
) -> None:
    """A snapshot store saves over main's file and reads back what it saved."""
    runs = copied("snapshot", tmp_path)
    store = FileStore(runs)
    handle, state = store.open_sync("snap-1")
    state.messages.append(ToolResult(call_id="c9", name="t", content="later"))
    handle.save_sync(state)
    handle.close_sync()
    assert store.read_sync("snap-1") == state


def test_a_version_2_log_holding_keyed_changes_is_corrupt(tmp_path: Path) -> None:
    """Keyed changes in the log of a version-2 snapshot are refused, never half applied."""
    runs = copied("journal", tmp_path)
    log = runs / "jour-1.1.log"
    data = log.read_bytes()
    last_seq = journal._read_watermark((runs / "jour-1.lock").read_bytes())  # noqa: SLF001 -- the test crafts the journal's own records
    assert last_seq is not None
    payload = b'{"seq":%d,"put":{"workspace":{"x":"%s"}}}' % (last_seq[1] + 1, b"e" * 64)
    log.write_bytes(data + journal._frame(payload))  # noqa: SLF001 -- the test crafts the journal's own records
    with pytest.raises(durably.CheckpointCorrupt, match="by key"):
        JournalStore(runs).read_sync("jour-1")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (b'"drop":{"workspace":["nowhere.py"]}', "does not hold"),
        (b'"put":{"turns":{"a":1}}', "by key"),
        (b'"put":{"workspace":{"a":1}}', "field workspace"),
    ],
    ids=["dropped key absent", "not a dict field", "wrong value type"],
)
def test_a_keyed_change_that_does_not_fit_the_state_is_corrupt(
    tmp_path: Path, change: bytes, reason: str
) -> None:
    """A put or drop naming a key, a field or a value the state cannot have is CheckpointCorrupt."""
    runs = copied("journal", tmp_path)
    store = JournalStore(runs)
    handle, state = store.open_sync("jour-1")
    handle.save_sync(state)  # now version 3, generation 2
    handle.close_sync()
    log = runs / "jour-1.2.log"
    log.write_bytes(log.read_bytes() + journal._frame(b'{"seq":1,%s}' % change))  # noqa: SLF001 -- the test crafts the journal's own records
    with pytest.raises(durably.CheckpointCorrupt, match=reason):
        store.read_sync("jour-1")


def test_a_version_1_snapshot_naming_a_log_loads_and_is_rewritten_as_version_3(
    tmp_path: Path,
) -> None:
    """The oldest journal form (version 1 naming a log with no header) still loads and moves on."""
    runs = copied("journal", tmp_path)
    opened = open_sealed((runs / "jour-1.json").read_bytes(), path="x")
    body = encode_state(opened.state)
    old = b'{"durably":1,"crc32":%d,"journal":1,"state":%s}' % (zlib.crc32(body), body)
    (runs / "jour-1.json").write_bytes(old)
    log = runs / "jour-1.1.log"
    framed = journal._unframe(log.read_bytes(), 0)  # noqa: SLF001 -- the test crafts the journal's own records
    assert framed is not None
    log.write_bytes(log.read_bytes()[framed[1] :])  # version 1 logs had no header record
    (runs / "jour-1.lock").write_bytes(b"")  # nor a watermark
    store = JournalStore(runs)
    assert store.read_sync("jour-1") == expected("jour-1")
    handle, state = store.open_sync("jour-1")
    handle.save_sync(state)
    handle.close_sync()
    assert envelope_version(runs / "jour-1.json") == 3
    assert store.read_sync("jour-1") == state
