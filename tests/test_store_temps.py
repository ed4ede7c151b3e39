"""Temp files in the state directory: each run removes exactly its own, never another run's."""

from __future__ import annotations

from pathlib import Path

import pytest

from _helpers.samples import state_a, state_b
from durably import faults
from durably._sysio import is_temp_name, temp_name
from durably.checkpoint.envelope import seal
from durably.stores.file import FileStore
from durably.stores.journal import JournalStore


def test_temp_names_match_their_own_stem_only() -> None:
    """A temp of run ``a.b`` is not a temp of run ``a``, nor of ``a.b.c``: the stem is exact."""
    mine = temp_name("a")
    theirs = temp_name("a.b")
    assert is_temp_name(mine, "a")
    assert not is_temp_name(theirs, "a")
    assert is_temp_name(theirs, "a.b")
    assert not is_temp_name(theirs, "a.b.c")
    assert not is_temp_name(".a.0123456789ab.tmp", "a")  # wrong length: not one of ours
    assert is_temp_name(mine)
    assert is_temp_name(theirs)


def test_opening_run_a_never_removes_run_a_b_temp(tmp_path: Path) -> None:
    """Opening run ``a`` removes ``.a.<hex>.tmp`` but leaves ``.a.b.<hex>.tmp`` of run ``a.b``
    (it deleted it, and run a.b's saves then failed).
    """
    runs = tmp_path / "runs"
    store = FileStore(runs, sync=False)
    store.create_sync(state_a("a")).close_sync()
    other = store.create_sync(state_a("a.b"))
    mine = runs / ".a.0123456789abcdef.tmp"
    theirs = runs / ".a.b.0123456789abcdef.tmp"
    mine.write_text("left by a")
    theirs.write_text("a.b saving right now")
    handle, _ = store.open_sync("a")
    handle.close_sync()
    assert not mine.exists()
    assert theirs.exists()
    other.save_sync(state_b("a.b"))
    other.close_sync()
    store.close_sync()


@pytest.mark.parametrize("make", [FileStore, JournalStore])
def test_a_save_of_a_b_survives_run_a_opened_in_its_middle(
    tmp_path: Path, make: type[FileStore]
) -> None:
    """Run ``a`` opened while a save of ``a.b`` sits between its temp write and its rename: the
    save still succeeds and loads back, on both stores (it failed with SaveFailed).
    """
    store = make(tmp_path / "runs", sync=False)
    store.create_sync(state_a("a")).close_sync()
    other = store.create_sync(state_a("a.b"))

    def open_a(label: str) -> None:
        if label == "store.save.temp_written":
            handle, _ = store.open_sync("a")
            handle.close_sync()

    with faults.installed(faults.CrashPlan(on_point=open_a)):
        other._write_snapshot(seal(state_b("a.b")))  # noqa: SLF001 -- a save of the other run, stopped at its temp write
    other.close_sync()
    assert store.read_sync("a.b").messages == state_b("a.b").messages
    store.close_sync()
