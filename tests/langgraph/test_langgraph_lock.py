"""A thread's lock file, checked before every append, and a failed append's record.

The owner compares the lock file's name with the descriptor it locked before
each put and put_writes; whichever way the name stops leading to that file, it
stops before writing, so a second owner that got in is never overwritten.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path

import pytest
from _lg_calls import put, put_writes

from durably import LockLost, SaveFailed
from durably._sysio import FileSystem
from durably.langgraph import DurablySaver


def _delete(lock: Path) -> None:
    lock.unlink()


def _replace(lock: Path) -> None:
    other = lock.with_name("other")
    other.write_bytes(b"")
    other.replace(lock)


def _move_away(lock: Path) -> None:
    lock.replace(lock.with_name("t.lock.old"))


LOSSES: dict[str, Callable[[Path], None]] = {
    "deleted": _delete,
    "replaced": _replace,
    "moved away": _move_away,
}


def _logs(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.glob("t.*log")}


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("call", ["put", "put_writes"])
def test_a_lost_lock_file_stops_the_owner_before_it_writes(
    tmp_path: Path, loss: str, call: str
) -> None:
    """Once the lock file's name no longer leads to the locked file, the owner's next put or
    put_writes raises LockLost and writes nothing, and a second owner's records stay whole.
    """
    first = DurablySaver(tmp_path)
    put(first, 1)
    put_writes(first, 1, "a")  # opens the writes log: the next put_writes appends without the lock
    LOSSES[loss](tmp_path / "t.lock")
    with DurablySaver(tmp_path) as second:  # a new lock file: the second owner gets in
        put(second, 2)
        put_writes(second, 2, "b")
    written = _logs(tmp_path)
    attempt: Callable[[], None]
    attempt = (lambda: put(first, 3)) if call == "put" else (lambda: put_writes(first, 2, "c"))
    with pytest.raises(LockLost, match="deleted or replaced"):
        attempt()
    assert _logs(tmp_path) == written
    with DurablySaver(tmp_path) as reader:
        latest = reader.get_tuple({"configurable": {"thread_id": "t"}})
    assert latest is not None
    assert latest.checkpoint["id"] == "0002"
    assert [w[0] for w in latest.pending_writes or []] == ["b"]
    put(first, 3)  # the handle was let go: this claims the thread again and reads the disk
    first.close()
    with DurablySaver(tmp_path) as reader:
        latest = reader.get_tuple({"configurable": {"thread_id": "t"}})
        ids = [found.checkpoint["id"] for found in reader.list(None)]
    assert latest is not None
    assert latest.parent_config is not None
    assert latest.parent_config["configurable"]["checkpoint_id"] == "0002"
    assert ids == ["0003", "0002", "0001"]


class FailingWrite(FileSystem):
    """Fails the next write to a thread's log with EIO, once ``fail`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = False

    def write(self, fd: int, data: bytes) -> None:
        """Write, or fail once with EIO."""
        if self.fail:
            self.fail = False
            raise OSError(errno.EIO, "injected")
        super().write(fd, data)


@pytest.mark.parametrize("call", ["put", "put_writes"])
def test_a_failed_write_is_never_read_back_and_the_next_call_goes_on_from_the_disk(
    tmp_path: Path, call: str
) -> None:
    """An append applies its record to the index before its write: when the write fails, the
    saver drops that index, so the record is not read back, and the next call reads the disk.
    """
    fs = FailingWrite()
    saver = DurablySaver(tmp_path, fs=fs)
    put(saver, 1)
    put_writes(saver, 1, "a")  # the writes log is open: a put_writes now appends without the lock
    fs.fail = True
    attempt: Callable[[], None]
    attempt = (lambda: put(saver, 2)) if call == "put" else (lambda: put_writes(saver, 1, "b"))
    with pytest.raises(SaveFailed, match="Input/output error"):
        attempt()
    latest = saver.get_tuple({"configurable": {"thread_id": "t"}})
    assert latest is not None
    assert latest.checkpoint["id"] == "0001"
    assert [w[0] for w in latest.pending_writes or []] == ["a"]
    attempt()
    saver.close()
    with DurablySaver(tmp_path) as reader:
        ids = [found.checkpoint["id"] for found in reader.list(None)]
        first = reader.get_tuple({"configurable": {"thread_id": "t", "checkpoint_id": "0001"}})
    assert first is not None
    assert ids == (["0002", "0001"] if call == "put" else ["0001"])
    assert [w[0] for w in first.pending_writes or []] == (["a"] if call == "put" else ["a", "b"])
