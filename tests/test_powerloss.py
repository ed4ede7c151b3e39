"""Power-loss mode: every disk a power cut may leave loads as the old or the new state.

Which test catches which seeded mutant (see ``durably.sweep.powerloss``):

- ``no-file-fsync``: ``check_protocol``, an unreadable (empty or torn) state file after the rename;
- ``no-dir-fsync``: ``check_protocol``, an older save loads after a newer one returned;
- ``write-in-place``: ``check_protocol``, an unreadable (truncated) state file mid-save;
- ``unlink-then-rename``: ``check_protocol``, ``RunNotFound`` between the unlink and the rename;
- ``no-new-dir-sync``: ``check_protocol``, the state directory undone after the create returned;
- ``lock-deleted-on-release``: ``check_lock_exclusion``, two handles own the run at once.

All in ``test_each_seeded_mutant_is_caught``.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest

import durably
from durably.checkpoint.envelope import open_envelope
from durably.state import RunState
from durably.stores.file import FileStore
from durably.sweep.powerloss import (
    MUTANTS,
    DiskImage,
    Kind,
    PowerLossFS,
    Violation,
    check_lock_exclusion,
    check_protocol,
    check_workspace,
    explore,
    numbered_state,
)
from durably.workspace import Workspace


@pytest.fixture
def modelled(tmp_path: Path) -> Iterator[tuple[PowerLossFS, FileStore]]:
    """A store on a power-loss file system that has created run r1 (save 1) and saved it once
    more (save 2).
    """
    root = tmp_path / "disk"
    root.mkdir()
    fs = PowerLossFS(root)
    store = FileStore(root / "runs", fs=fs)
    handle = store.create_sync(numbered_state(1))
    handle.save_sync(numbered_state(2))
    yield fs, store
    handle.close_sync()
    store.close_sync()


def saved(n: int) -> RunState:
    """State ``n`` as it compares after loading (the save time cleared)."""
    return numbered_state(n)


def load(image: DiskImage, where: Path) -> RunState:
    """Materialise ``image`` at ``where`` and read run r1 with a fresh, normal store."""
    image.materialise(where)
    store = FileStore(where / "runs")
    try:
        return msgspec.structs.replace(store.read_sync("r1"), saved_at=None)
    finally:
        store.close_sync()


def last(fs: PowerLossFS, kind: str) -> int:
    """The op-log boundary just after the last op of ``kind``."""
    return max(i for i, op in enumerate(fs.log) if op.kind == kind) + 1


def temp_file(image: DiskImage) -> bytes | None:
    """The content of the save's temp file in ``image``, if it survived."""
    temps = [data for path, data in image.files.items() if path.endswith(".tmp")]
    return temps[0] if temps else None


def test_the_real_protocol_survives_every_power_cut() -> None:
    """At every op of a create and four saves, every legal disk loads as the last returned save
    or the one in progress, and RunNotFound only until the create returned.
    """
    exploration = explore(saves=4)
    assert exploration.violations == []
    assert exploration.images >= exploration.states > 20
    assert exploration.capped == 0


def test_the_real_protocol_survives_with_directory_ops_kept_in_order() -> None:
    """With directory operations persisted in order (a metadata journal), the real protocol
    still has no violation: the in-order images are a subset, not a different model.
    """
    assert check_protocol(saves=2, reorder=False) == []


def test_new_parent_directories_are_synced_too() -> None:
    """A store whose state directory and its parents are new syncs each one into its parent, so
    no power cut takes away a run whose create returned.
    """
    assert check_protocol(saves=1, layout="a/b/runs") == []


def test_the_real_store_never_has_two_owners() -> None:
    """When an opener is preempted between opening the lock file and locking it while the owner
    closes, a third opener still gets Locked: the lock file stays one inode.
    """
    assert check_lock_exclusion() == []


def test_a_resumed_run_opens_on_every_disk_an_in_order_journal_allows() -> None:
    """A restarted process that opens the run (lock, temp-file cleanup, load) after any power cut
    gets the old or the new state when directory operations persist in order.
    """
    assert check_protocol(saves=2, reorder=False, resume=True) == []


def test_a_resumed_run_opens_even_when_directory_ops_reorder() -> None:
    """A restarted process can open the run after any power cut, even on a file system that
    persists directory operations on different names out of order.
    """
    assert check_protocol(saves=1, resume=True) == []


def test_the_real_workspace_survives_every_power_cut() -> None:
    """Workspace writes (one creating a directory) leave, on every legal disk after every power
    cut, the last write that returned or the one in progress, and only temp files the next owner
    removes.
    """
    assert check_workspace() == []


def test_workspace_writes_go_through_the_seam(tmp_path: Path) -> None:
    """The power-loss model sees a workspace write's every step: temp create, write, file fsync,
    rename, directory fsync (and the new directory's mkdir and its parent's fsync).
    """
    (tmp_path / "ws").mkdir()
    fs = PowerLossFS(tmp_path)
    Workspace(tmp_path / "ws", fs=fs).write("src/a.txt", "hello")
    steps = [(op.kind, op.path) for op in fs.log if op.mutates]
    temp = next(path for kind, path in steps if kind == "create")
    assert re.fullmatch(r"ws/src/\.a\.txt\.[0-9a-f]{16}\.tmp", temp)
    assert steps == [
        ("mkdir", "ws/src"),
        ("fsync", "ws"),
        ("create", temp),
        ("write", temp),
        ("fsync", temp),
        ("rename", temp),
        ("fsync", "ws/src"),
    ]


def found_older_save(violation: Violation) -> bool:
    """True when a save older than the last returned one loaded (the textbook lost durability)."""
    return violation.found.startswith("save ") and violation.found not in violation.expected


MUTANT_CASES: list[
    tuple[str, Callable[..., list[Violation]], Kind, Callable[[Violation], bool]]
] = [
    ("no-file-fsync", check_protocol, Kind.UNREADABLE, lambda v: "CheckpointCorrupt" in v.found),
    ("no-dir-fsync", check_protocol, Kind.LOST, found_older_save),
    ("write-in-place", check_protocol, Kind.UNREADABLE, lambda v: "CheckpointCorrupt" in v.found),
    ("unlink-then-rename", check_protocol, Kind.LOST, lambda v: v.found == "RunNotFound"),
    ("no-new-dir-sync", check_protocol, Kind.LOST, lambda v: v.found == "RunNotFound"),
    ("lock-deleted-on-release", check_lock_exclusion, Kind.TWO_OWNERS, lambda v: True),
    (
        "workspace-no-fsync",
        check_workspace,
        Kind.LOST,
        lambda v: "write 1 returned" in v.where and "0 bytes" in v.found,
    ),
]


@pytest.mark.parametrize(
    ("mutant", "check", "kind", "evidence"), MUTANT_CASES, ids=[c[0] for c in MUTANT_CASES]
)
def test_each_seeded_mutant_is_caught(
    mutant: str,
    check: Callable[..., list[Violation]],
    kind: Kind,
    evidence: Callable[[Violation], bool],
) -> None:
    """Each seeded mutant is caught by the check named beside it: check_protocol for the five
    save-protocol flaws, check_lock_exclusion for the lock file deleted on release,
    check_workspace for a workspace write renamed into place unsynced.
    """
    assert MUTANTS[mutant].caught_by == check.__name__
    violations = check(mutant=mutant)
    assert any(v.kind == kind and evidence(v) for v in violations), violations[:5]


def test_every_mutant_has_a_case() -> None:
    """The mutant table and the parametrized cases list the same mutants."""
    assert sorted(MUTANTS) == sorted(case[0] for case in MUTANT_CASES)


def test_an_unknown_mutant_is_refused() -> None:
    """Asking for a mutant that does not exist is an error naming the ones that do."""
    with pytest.raises(ValueError, match="no-dir-fsync"):
        check_protocol(mutant="no-such-mutant")


def test_a_power_cut_between_write_and_fsync_may_tear_the_new_data(
    modelled: tuple[PowerLossFS, FileStore], tmp_path: Path
) -> None:
    """Between the temp file's write and its fsync, every disk still loads the old state, while
    the temp file may hold the new state whole, torn, or garbage (which would be corrupt).
    """
    fs, _ = modelled
    images = fs.images(at=last(fs, "write"))
    temps = [temp_file(image) for image in images]
    assert [load(image, tmp_path / f"image{i}") for i, image in enumerate(images)] == [
        saved(1)
    ] * len(images)
    assert None in temps
    whole, broken = 0, 0
    for data in temps:
        if not data:
            continue
        try:
            state = open_envelope(data, path="temp")
        except durably.CheckpointCorrupt:
            broken += 1
        else:
            assert msgspec.structs.replace(state, saved_at=None) == saved(2)
            whole += 1
    assert whole == 1
    assert broken >= 5
    descriptions = " ".join(image.description for image in images)
    assert "torn" in descriptions
    assert "garbage" in descriptions


def test_a_power_cut_after_an_unsynced_rename_may_undo_it(
    modelled: tuple[PowerLossFS, FileStore], tmp_path: Path
) -> None:
    """After the rename and before the directory's fsync, a power cut may leave the old state
    or the new one, and nothing else.
    """
    fs, _ = modelled
    images = fs.images(at=last(fs, "rename"))
    loaded = [load(image, tmp_path / f"image{i}") for i, image in enumerate(images)]
    assert saved(1) in loaded
    assert saved(2) in loaded
    assert set(map(msgspec.json.encode, loaded)) == {
        msgspec.json.encode(saved(1)),
        msgspec.json.encode(saved(2)),
    }


def test_a_power_cut_after_the_directory_fsync_leaves_the_new_state_only(
    modelled: tuple[PowerLossFS, FileStore], tmp_path: Path
) -> None:
    """Once the directory is synced, the only legal disk is the one holding the new state."""
    fs, _ = modelled
    images = fs.images(at=last(fs, "fsync"))
    assert len(images) == 1
    assert load(images[0], tmp_path / "image") == saved(2)


def test_images_are_materialised_private(
    modelled: tuple[PowerLossFS, FileStore], tmp_path: Path
) -> None:
    """An image's directories are created 0700 and its files 0600, whatever the umask."""
    fs, _ = modelled
    image = fs.images(at=last(fs, "write"))[0]
    root = image.materialise(tmp_path / "image")
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), path


def test_an_o_dsync_write_is_durable_and_reserved_space_reads_as_zeros(tmp_path: Path) -> None:
    """A write through an O_DSYNC descriptor survives every power cut; unsynced reservation
    leaves the old size or zeros, and a plain write after it may still be lost.
    """
    root = tmp_path / "disk"
    root.mkdir(mode=0o700)
    fs = PowerLossFS(root)
    dir_fd = fs.open_dir(str(root))
    fd = fs.open("log", os.O_WRONLY | os.O_CREAT | os.O_DSYNC, 0o600, dir_fd=dir_fd)
    fs.fsync(dir_fd)
    fs.write(fd, b"first")
    durable = {image.files["log"] for image in fs.images()}
    assert durable == {b"first"}
    assert fs.allocate(fd, 5, 11)
    assert {image.files["log"] for image in fs.images()} == {b"first", b"first" + bytes(11)}
    plain = fs.open("log", os.O_WRONLY, 0, dir_fd=dir_fd)
    os.lseek(plain, 5, os.SEEK_SET)
    fs.write(plain, b"second")
    after = {image.files["log"] for image in fs.images()}
    assert b"first" in after, "a write without O_DSYNC is not durable"
    assert b"firstsecond" + bytes(5) in after
    for descriptor in (plain, fd, dir_fd):
        fs.close(descriptor)
