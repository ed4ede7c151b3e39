"""The snapshot file store: save protocol, locks, modes, symlinks, bad IDs, bad bytes, bad disks."""

from __future__ import annotations

import asyncio
import errno
import os
import random
import re
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typing_extensions import override

import durably
from _helpers import CHILD
from _helpers.patience import stretched
from _helpers.samples import state_a, state_b, without_saved_at
from durably import _sysio as sysio
from durably._sysio import FileSystem
from durably.checkpoint.envelope import seal
from durably.keys import RUN_ID_PATTERN
from durably.state import FORMAT, RunState
from durably.stores import RunHandle, Store, rundir
from durably.stores.file import FileStore

TEMP = re.compile(r"\.r1\.[0-9a-f]{16}\.tmp")


class RecordingFS(FileSystem):
    """The real file system, recording every call in order (fds are the values returned)."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    @override
    def open_dir(self, path: str) -> int:
        self.calls.append(("open_dir", path))
        fd = super().open_dir(path)
        self.calls[-1] += (fd,)
        return fd

    @override
    def mkdir(self, path: str, mode: int) -> None:
        self.calls.append(("mkdir", path, mode))
        super().mkdir(path, mode)

    @override
    def open(self, name: str, flags: int, mode: int, *, dir_fd: int) -> int:
        self.calls.append(("open", name, flags, mode))
        fd = super().open(name, flags, mode, dir_fd=dir_fd)
        self.calls[-1] += (fd,)
        return fd

    @override
    def write(self, fd: int, data: bytes) -> None:
        self.calls.append(("write", fd))
        super().write(fd, data)

    @override
    def read(self, fd: int) -> bytes:
        self.calls.append(("read", fd))
        return super().read(fd)

    @override
    def fsync(self, fd: int) -> None:
        self.calls.append(("fsync", fd))
        super().fsync(fd)

    @override
    def rename(self, src: str, dst: str, *, dir_fd: int) -> None:
        self.calls.append(("rename", src, dst))
        super().rename(src, dst, dir_fd=dir_fd)

    @override
    def unlink(self, name: str, *, dir_fd: int) -> None:
        self.calls.append(("unlink", name))
        super().unlink(name, dir_fd=dir_fd)

    @override
    def close(self, fd: int) -> None:
        self.calls.append(("close", fd))
        super().close(fd)

    @override
    def lstat(self, name: str, *, dir_fd: int) -> os.stat_result | None:
        self.calls.append(("lstat", name))
        return super().lstat(name, dir_fd=dir_fd)

    @override
    def listdir(self, dir_fd: int) -> list[str]:
        self.calls.append(("listdir", dir_fd))
        return super().listdir(dir_fd)

    @override
    def lock(self, fd: int) -> bool:
        self.calls.append(("lock", fd))
        return super().lock(fd)


class FaultyFS(FileSystem):
    """The real file system failing one kind of step of a save with an errno, once armed.

    Steps: ``open`` (of a temp file), ``write`` (fails after writing half), ``fsync file``,
    ``rename``, ``fsync dir``. ``times`` is how often it fails; None means every time.
    """

    def __init__(self, step: str, err: int, times: int | None) -> None:
        self.step, self.err, self.left = step, err, times
        self.armed = False
        self.failures = 0
        self.dir_fds: set[int] = set()
        self.dir_opens = 0
        self.fsynced: list[int] = []

    def _will_fail(self, step: str) -> bool:
        return self.armed and step == self.step and (self.left is None or self.left > 0)

    def _fault(self, step: str) -> None:
        if self._will_fail(step):
            if self.left is not None:
                self.left -= 1
            self.failures += 1
            raise OSError(self.err, os.strerror(self.err))

    @override
    def open_dir(self, path: str) -> int:
        fd = super().open_dir(path)
        self.dir_fds.add(fd)
        self.dir_opens += 1
        return fd

    @override
    def close(self, fd: int) -> None:
        self.dir_fds.discard(fd)
        super().close(fd)

    @override
    def open(self, name: str, flags: int, mode: int, *, dir_fd: int) -> int:
        if name.endswith(".tmp"):
            self._fault("open")
        return super().open(name, flags, mode, dir_fd=dir_fd)

    @override
    def write(self, fd: int, data: bytes) -> None:
        if self._will_fail("write"):
            super().write(fd, data[: len(data) // 2])
        self._fault("write")
        super().write(fd, data)

    @override
    def fsync(self, fd: int) -> None:
        self._fault("fsync dir" if fd in self.dir_fds else "fsync file")
        self.fsynced.append(fd)
        super().fsync(fd)

    @override
    def rename(self, src: str, dst: str, *, dir_fd: int) -> None:
        self._fault("rename")
        super().rename(src, dst, dir_fd=dir_fd)


def temp_files(directory: Path) -> list[str]:
    """Temp files a save left in the state directory."""
    return [name for name in os.listdir(directory) if name.endswith(".tmp")]


def fingerprint(path: Path) -> tuple[bytes, int]:
    """A file's bytes and modification time, to show it was not touched."""
    return path.read_bytes(), path.stat().st_mtime_ns


def victim(tmp_path: Path) -> Path:
    """A file outside the state directory that a planted symlink points at."""
    path = tmp_path / "victim.txt"
    path.write_bytes(b"precious bytes that must stay as they are\n")
    return path


# -- the basics ------------------------------------------------------------------------


def test_a_created_run_opens_with_the_state_it_was_created_with(store: FileStore) -> None:
    """``open`` loads exactly the state create saved, with the save time set by the store."""
    store.create_sync(state_b("r1")).close_sync()
    handle, loaded = store.open_sync("r1")
    handle.close_sync()
    assert without_saved_at(loaded) == state_b("r1")
    assert loaded.saved_at is not None


def test_the_newest_save_is_what_opens(store: FileStore) -> None:
    """After several saves, a later open loads the last one."""
    handle = store.create_sync(state_a("r1"))
    handle.save_sync(state_b("r1"))
    final = state_b("r1")
    final.answer = "done"
    handle.save_sync(final)
    handle.close_sync()
    assert store.read_sync("r1").answer == "done"


def test_a_used_run_id_cannot_be_created_again(store: FileStore) -> None:
    """``create`` refuses an ID this store already used, and leaves that run as it was."""
    store.create_sync(state_b("r1")).close_sync()
    with pytest.raises(durably.RunExists):
        store.create_sync(state_a("r1"))
    assert without_saved_at(store.read_sync("r1")) == state_b("r1")


def test_opening_an_unknown_run_is_run_not_found(store: FileStore, state_dir: Path) -> None:
    """``open`` and read of an ID with no state file raise RunNotFound naming the store."""
    store.create_sync(state_a("r1")).close_sync()
    with pytest.raises(durably.RunNotFound) as caught:
        store.open_sync("r2")
    assert caught.value.where == str(state_dir)
    with pytest.raises(durably.RunNotFound):
        store.read_sync("r2")


def test_list_runs_names_runs_only(store: FileStore, state_dir: Path) -> None:
    """list_runs gives the run IDs sorted, never a lock or temp file, without taking locks."""
    assert store.list_runs_sync() == []
    for run_id in ("b2", "a1", "c3"):
        store.create_sync(state_a(run_id)).close_sync()
    held = store.create_sync(state_a("d4"))
    (state_dir / ".a1.0123456789abcdef.tmp").write_bytes(b"half")
    assert store.list_runs_sync() == ["a1", "b2", "c3", "d4"]
    held.close_sync()


def test_read_works_while_the_run_is_owned(store: FileStore) -> None:
    """``read`` loads a run's state without its lock, so people can look at a running run."""
    handle = store.create_sync(state_b("r1"))
    assert without_saved_at(FileStore(store.directory).read_sync("r1")) == state_b("r1")
    handle.close_sync()


def test_a_second_open_in_the_same_process_is_locked(store: FileStore, state_dir: Path) -> None:
    """Even in one process, a run open on one handle is Locked for another until closed."""
    handle = store.create_sync(state_a("r1"))
    with pytest.raises(durably.Locked) as caught:
        FileStore(state_dir).open_sync("r1")
    assert caught.value.path == str(state_dir / "r1.lock")
    handle.close_sync()
    again, _ = FileStore(state_dir).open_sync("r1")
    again.close_sync()


def test_the_lock_file_stays_after_close(store: FileStore, state_dir: Path) -> None:
    """Closing a run keeps its lock file (deleting it would race a new opener)."""
    store.create_sync(state_a("r1")).close_sync()
    assert (state_dir / "r1.lock").is_file()


def test_a_closed_handle_refuses_to_save(store: FileStore) -> None:
    """Saving through a closed handle is SaveFailed; the saved state stays."""
    handle = store.create_sync(state_a("r1"))
    handle.close_sync()
    with pytest.raises(durably.SaveFailed, match="closed"):
        handle.save_sync(state_b("r1"))
    assert without_saved_at(store.read_sync("r1")) == state_a("r1")


def test_a_state_file_of_another_run_is_corrupt(store: FileStore, state_dir: Path) -> None:
    """A state file holding a different run ID than its name is CheckpointCorrupt."""
    store.create_sync(state_a("r1")).close_sync()
    shutil.copy(state_dir / "r1.json", state_dir / "r2.json")
    (state_dir / "r2.lock").touch(mode=0o600)
    with pytest.raises(durably.CheckpointCorrupt, match="holds run 'r1'"):
        store.open_sync("r2")


def test_a_checkpoint_of_a_newer_format_is_refused(store: FileStore, state_dir: Path) -> None:
    """A run saved by a newer durably is CheckpointTooNew on open, and the file is kept."""
    store.create_sync(state_a("r1")).close_sync()
    newer = state_a("r1")
    newer.format = FORMAT + 1
    path = state_dir / "r1.json"
    path.write_bytes(seal(newer))
    before = path.read_bytes()
    with pytest.raises(durably.CheckpointTooNew) as caught:
        store.open_sync("r1")
    assert caught.value.path == str(path)
    assert path.read_bytes() == before


def test_the_async_interface_does_what_the_sync_one_does(state_dir: Path) -> None:
    """create, save, close, open, read and list_runs work through the async Store protocol."""

    async def scenario() -> tuple[RunState, RunState, list[str]]:
        store = FileStore(state_dir)
        assert isinstance(store, Store)
        async with await store.create(state_a("r1")) as handle:
            assert isinstance(handle, RunHandle)
            assert handle.run_id == "r1"
            await handle.save(state_b("r1"))
        handle, opened = await store.open("r1")
        await handle.close()
        read = await store.read("r1")
        runs = await store.list_runs()
        await store.close()
        return opened, read, runs

    opened, read, runs = asyncio.run(scenario())
    assert without_saved_at(opened) == state_b("r1")
    assert read == opened
    assert runs == ["r1"]


def test_describe_names_the_state_file(store: FileStore, state_dir: Path) -> None:
    """``describe`` gives the path of the run's state file, for messages."""
    assert store.describe("r1") == str(state_dir / "r1.json")


def test_a_network_file_system_is_refused(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A state directory on NFS is UnsafePath unless explicitly allowed."""
    monkeypatch.setattr(rundir, "filesystem_type", lambda path: "nfs4")
    with pytest.raises(durably.UnsafePath, match="nfs4"):
        FileStore(state_dir).create_sync(state_a("r1"))
    allowed = FileStore(state_dir, allow_network_fs=True)
    allowed.create_sync(state_a("r1")).close_sync()
    allowed.close_sync()


# -- the crash-atomic protocol -----------------------------------------------------------


def test_a_save_writes_syncs_renames_then_syncs_the_directory(state_dir: Path) -> None:
    """At the seam, a save checks its lock file, opens a new 0600 temp, writes, fsyncs, renames
    it, fsyncs the dir.
    """
    fs = RecordingFS()
    store = FileStore(state_dir, fs=fs)
    handle = store.create_sync(state_a("r1"))
    dir_fd = next(call[2] for call in fs.calls if call[:2] == ("open_dir", str(state_dir)))
    fs.calls.clear()
    handle.save_sync(state_b("r1"))
    saved = list(fs.calls)
    handle.close_sync()
    store.close_sync()
    _, temp, flags, mode, fd = saved[2]
    assert isinstance(temp, str)
    assert isinstance(flags, int)
    assert TEMP.fullmatch(temp)
    assert (
        flags & (os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW) == os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    )
    assert mode == 0o600
    assert saved == [
        ("lstat", "r1.lock"),
        ("lstat", "r1.json"),
        ("open", temp, flags, 0o600, fd),
        ("write", fd),
        ("fsync", fd),
        ("close", fd),
        ("rename", temp, "r1.json"),
        ("fsync", dir_fd),
    ]


def test_every_save_uses_a_new_unpredictable_temp_name(state_dir: Path) -> None:
    """Each save writes a temp with a fresh random name starting with a dot."""
    fs = RecordingFS()
    store = FileStore(state_dir, fs=fs)
    handle = store.create_sync(state_a("r1"))
    for _ in range(5):
        handle.save_sync(state_b("r1"))
    handle.close_sync()
    store.close_sync()
    temps = [call[1] for call in fs.calls if call[0] == "open" and str(call[1]).endswith(".tmp")]
    assert len(temps) == 6
    assert len(set(temps)) == 6
    assert all(TEMP.fullmatch(str(name)) for name in temps)


def test_with_sync_off_nothing_is_fsynced(state_dir: Path) -> None:
    """sync=False (for tests only) skips every fsync but still renames a whole temp over."""
    fs = RecordingFS()
    store = FileStore(state_dir, sync=False, fs=fs)
    handle = store.create_sync(state_a("r1"))
    handle.save_sync(state_b("r1"))
    handle.close_sync()
    store.close_sync()
    names = [call[0] for call in fs.calls]
    assert "fsync" not in names
    assert names.count("rename") == 2


def test_a_new_state_directory_is_synced_into_its_parent(tmp_path: Path) -> None:
    """Creating the state directory makes it 0700, then fsyncs its parent before any run file."""
    fs = RecordingFS()
    store = FileStore(tmp_path / "runs", fs=fs)
    store.create_sync(state_a("r1")).close_sync()
    store.close_sync()
    assert fs.calls[0] == ("mkdir", str(tmp_path / "runs"), 0o700)
    parent_fd = fs.calls[1][2]
    assert fs.calls[1] == ("open_dir", str(tmp_path), parent_fd)
    assert fs.calls[2:4] == [("fsync", parent_fd), ("close", parent_fd)]


def parse_strace(text: str) -> list[tuple[str, list[str], int]]:
    """(syscall, arguments, result) for every completed call in an strace -f log."""
    calls = []
    for line in text.splitlines():
        match = re.match(r"^(?:\d+\s+)?(\w+)\((.*)\)\s+=\s+(-?\d+)", line)
        if match:
            args = re.findall(r'\s*("(?:[^"\\]|\\.)*"(?:\.\.\.)?|[^,]+),?', match[2])
            calls.append((match[1], args, int(match[3])))
    return calls


def test_the_kernel_sees_temp_write_fsync_rename_dir_fsync(tmp_path: Path) -> None:
    """Traced with strace, each save is: openat temp (O_CREAT|O_EXCL|O_NOFOLLOW, 0600), write,
    fsync it, rename it over RUN.json, fsync the directory, in that order.
    """
    state_dir = tmp_path / "runs"
    log = tmp_path / "trace.txt"
    syscalls = "openat,write,fsync,fdatasync,rename,renameat,renameat2"
    command = ["strace", "-f", "-s", "128", "-e", f"trace={syscalls}", "-o", str(log)]
    child = subprocess.run(
        [*command, sys.executable, str(CHILD), "save", str(state_dir), "r1"],
        capture_output=True,
        text=True,
        timeout=stretched(60),
        check=False,
    )
    assert child.returncode == 0, child.stderr
    calls = parse_strace(log.read_text())
    dir_fd = next(
        result
        for name, args, result in calls
        if name == "openat" and args[1] == f'"{state_dir}"' and "O_DIRECTORY" in args[2]
    )
    events: list[str] = []
    temps: list[str] = []
    for name, args, result in calls:
        if name == "openat" and args[0] == str(dir_fd) and TEMP.fullmatch(args[1].strip('"')):
            flags = set(args[2].split("|"))
            assert {"O_WRONLY", "O_CREAT", "O_EXCL", "O_NOFOLLOW"} <= flags, args
            assert args[3] == "0600", args
            temps.append(args[1].strip('"'))
            events.append(f"open temp {len(temps)} -> fd {result}")
        elif name == "openat" and args[1] == '"r1.json"':
            assert "O_RDONLY" in args[2], "the run's file is only ever replaced by rename"
        elif name in ("write", "fsync", "fdatasync") and events:
            events.append(f"{name} fd {args[0]}")
        elif name in ("renameat", "renameat2"):
            assert args[0] == args[2] == str(dir_fd), args
            events.append(f"rename {args[1].strip(chr(34))} -> {args[3].strip(chr(34))}")
        elif name == "rename":
            events.append(f"rename {args[0]} -> {args[1]}")
    assert len(temps) == 2, "create saves once, then the child saves once more"
    fds = re.findall(r"-> fd (\d+)", "\n".join(events))
    expected = []
    for number, (temp, fd) in enumerate(zip(temps, fds, strict=True), start=1):
        expected += [
            f"open temp {number} -> fd {fd}",
            f"write fd {fd}",
            f"fsync fd {fd}",
            f"rename {temp} -> r1.json",
            f"fsync fd {dir_fd}",
        ]
    collapsed = [event for n, event in enumerate(events) if n == 0 or event != events[n - 1]]
    assert collapsed == expected


# -- modes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077], ids=lambda mask: f"umask{mask:03o}")
def test_the_state_directory_is_0700_and_its_files_0600(tmp_path: Path, umask: int) -> None:
    """Whatever the umask, the store makes its directory 0700 and its state and lock files 0600."""
    state_dir = tmp_path / "runs"
    previous = os.umask(umask)
    try:
        store = FileStore(state_dir)
        handle = store.create_sync(state_a("r1"))
        handle.save_sync(state_b("r1"))
        handle.close_sync()
        store.close_sync()
    finally:
        os.umask(previous)
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((state_dir / "r1.json").stat().st_mode) == 0o600
    assert stat.S_IMODE((state_dir / "r1.lock").stat().st_mode) == 0o600


# -- symlinks --------------------------------------------------------------------------------


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file", "dangling"])
def test_a_symlink_at_the_lock_is_refused_on_create(
    tmp_path: Path, state_dir: Path, dangling: bool
) -> None:
    """``create`` with a symlink planted at RUN.lock is UnsafePath; nothing is made through it."""
    target = tmp_path / "nowhere" if dangling else victim(tmp_path)
    before = None if dangling else fingerprint(target)
    state_dir.mkdir(mode=0o700)
    (state_dir / "r1.lock").symlink_to(target)
    with pytest.raises(durably.UnsafePath, match=r"r1\.lock"):
        FileStore(state_dir).create_sync(state_a("r1"))
    if dangling:
        assert not target.exists()
    else:
        assert fingerprint(target) == before
    assert not (state_dir / "r1.json").exists()


def test_a_symlink_at_the_lock_is_refused_on_open(tmp_path: Path, store: FileStore) -> None:
    """``open`` of a run whose RUN.lock became a symlink is UnsafePath; the target is untouched."""
    store.create_sync(state_a("r1")).close_sync()
    target = victim(tmp_path)
    before = fingerprint(target)
    lock = store.directory / "r1.lock"
    lock.unlink()
    lock.symlink_to(target)
    with pytest.raises(durably.UnsafePath, match=r"r1\.lock"):
        store.open_sync("r1")
    assert fingerprint(target) == before


def test_a_symlink_at_the_lock_of_a_missing_run_is_refused(tmp_path: Path, state_dir: Path) -> None:
    """``open`` of a run that has only a planted RUN.lock symlink is UnsafePath, not RunNotFound."""
    target = victim(tmp_path)
    before = fingerprint(target)
    state_dir.mkdir(mode=0o700)
    (state_dir / "r1.lock").symlink_to(target)
    with pytest.raises(durably.UnsafePath):
        FileStore(state_dir).open_sync("r1")
    assert fingerprint(target) == before


def test_a_symlink_at_the_state_file_is_refused_on_create(tmp_path: Path, state_dir: Path) -> None:
    """``create`` with a symlink planted at RUN.json is UnsafePath; the target is untouched."""
    target = victim(tmp_path)
    before = fingerprint(target)
    state_dir.mkdir(mode=0o700)
    (state_dir / "r1.json").symlink_to(target)
    with pytest.raises(durably.UnsafePath, match=r"r1\.json"):
        FileStore(state_dir).create_sync(state_a("r1"))
    assert fingerprint(target) == before
    assert (state_dir / "r1.json").is_symlink()


@pytest.mark.parametrize("with_lock", [True, False], ids=["run-exists", "planted-alone"])
def test_a_symlink_at_the_state_file_is_refused_on_open_and_read(
    tmp_path: Path, store: FileStore, with_lock: bool
) -> None:
    """``open`` and read of a RUN.json that is a symlink are UnsafePath; the target is untouched."""
    target = victim(tmp_path)
    target.write_bytes(seal(state_a("r1")))
    before = fingerprint(target)
    if with_lock:
        store.create_sync(state_a("r1")).close_sync()
        (store.directory / "r1.json").unlink()
    else:
        store.directory.mkdir(mode=0o700)
    (store.directory / "r1.json").symlink_to(target)
    with pytest.raises(durably.UnsafePath, match=r"r1\.json"):
        store.open_sync("r1")
    with pytest.raises(durably.UnsafePath, match=r"r1\.json"):
        store.read_sync("r1")
    assert fingerprint(target) == before


def test_a_symlink_planted_at_the_state_file_during_a_run_stops_the_save(
    tmp_path: Path, store: FileStore
) -> None:
    """A save over a RUN.json that became a symlink is UnsafePath; link and target stay."""
    handle = store.create_sync(state_a("r1"))
    target = victim(tmp_path)
    before = fingerprint(target)
    link = store.directory / "r1.json"
    link.unlink()
    link.symlink_to(target)
    with pytest.raises(durably.UnsafePath):
        handle.save_sync(state_b("r1"))
    handle.close_sync()
    assert fingerprint(target) == before
    assert link.is_symlink()
    assert temp_files(store.directory) == []


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-directory", "dangling"])
def test_a_symlinked_state_directory_is_refused(tmp_path: Path, dangling: bool) -> None:
    """A state directory that is a symlink is UnsafePath for every operation; its target stays."""
    target = tmp_path / "elsewhere"
    if not dangling:
        target.mkdir()
        (target / "keep.txt").write_text("keep")
    link = tmp_path / "runs"
    link.symlink_to(target)
    before = None if dangling else (sorted(os.listdir(target)), target.stat().st_mtime_ns)
    store = FileStore(link)
    with pytest.raises(durably.UnsafePath):
        store.create_sync(state_a("r1"))
    with pytest.raises(durably.UnsafePath):
        store.open_sync("r1")
    with pytest.raises(durably.UnsafePath):
        store.read_sync("r1")
    with pytest.raises(durably.UnsafePath):
        store.list_runs_sync()
    if dangling:
        assert not target.exists()
    else:
        assert (sorted(os.listdir(target)), target.stat().st_mtime_ns) == before


def test_a_symlink_at_the_temp_name_is_never_followed(
    tmp_path: Path, store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A symlink planted at the exact temp name a save picks is refused (O_EXCL|O_NOFOLLOW)."""
    handle = store.create_sync(state_a("r1"))
    monkeypatch.setattr(sysio, "temp_name", lambda stem: f".{stem}.{'ab' * 8}.tmp")
    target = victim(tmp_path)
    before = fingerprint(target)
    link = store.directory / f".r1.{'ab' * 8}.tmp"
    link.symlink_to(target)
    with pytest.raises(durably.UnsafePath):
        handle.save_sync(state_b("r1"))
    handle.close_sync()
    assert fingerprint(target) == before
    assert without_saved_at(store.read_sync("r1")) == state_a("r1")


# -- hostile run IDs -------------------------------------------------------------------------

HOSTILE = [
    "",
    ".",
    "..",
    "a/b",
    "../r1",
    "a\x00b",
    "a" * 129,
    ".r1",
    "-r1",
    "_r1",
    "é",
    "r1\n",
    "r 1",
]


@pytest.mark.parametrize("bad", HOSTILE)
def test_a_hostile_run_id_is_refused_before_any_file_system_call(tmp_path: Path, bad: str) -> None:
    """create, open and read with a bad run ID raise InvalidRunId and make no file system call."""
    fs = RecordingFS()
    store = FileStore(tmp_path / "runs", fs=fs)
    with pytest.raises(durably.InvalidRunId):
        store.create_sync(RunState(run_id=bad, task="t", created_at=state_a("x").created_at))
    with pytest.raises(durably.InvalidRunId):
        store.open_sync(bad)
    with pytest.raises(durably.InvalidRunId):
        store.read_sync(bad)
    assert fs.calls == []
    assert not (tmp_path / "runs").exists()


@given(bad=st.text(max_size=140).filter(lambda text: RUN_ID_PATTERN.fullmatch(text) is None))
def test_any_run_id_outside_the_pattern_is_refused_untouched(
    tmp_path_factory: pytest.TempPathFactory, bad: str
) -> None:
    """Every string outside the run ID pattern is InvalidRunId with no file system call."""
    fs = RecordingFS()
    directory = tmp_path_factory.getbasetemp() / "never-created"
    store = FileStore(directory, fs=fs)
    with pytest.raises(durably.InvalidRunId):
        store.open_sync(bad)
    with pytest.raises(durably.InvalidRunId):
        store.read_sync(bad)
    assert fs.calls == []
    assert not directory.exists()


# -- corrupt checkpoints ----------------------------------------------------------------------


def load(action: Callable[[], RunState]) -> RunState | durably.CheckpointCorrupt:
    """What ``action`` loaded, or the CheckpointCorrupt it raised (any other error propagates)."""
    try:
        return action()
    except durably.CheckpointCorrupt as exc:
        return exc


def open_and_close(store: FileStore) -> RunState:
    """Open the run, close it at once, and return its state."""
    handle, state = store.open_sync("r1")
    handle.close_sync()
    return state


def attempt_to_load(store: FileStore, path: Path, content: bytes) -> list[RunState]:
    """Open and read the run after writing ``content`` to its file: the states that loaded.

    Asserts the only error is CheckpointCorrupt naming the file, and the file is unchanged.
    """
    path.write_bytes(content)
    outcomes = [load(lambda: open_and_close(store)), load(lambda: store.read_sync("r1"))]
    for outcome in outcomes:
        if isinstance(outcome, durably.CheckpointCorrupt):
            assert str(path) in str(outcome)
    assert path.read_bytes() == content
    return [outcome for outcome in outcomes if isinstance(outcome, RunState)]


def test_every_truncation_of_a_checkpoint_is_corrupt(state_dir: Path) -> None:
    """A checkpoint cut at any byte is CheckpointCorrupt naming the file, which stays as it was."""
    store = FileStore(state_dir, sync=False)
    store.create_sync(state_b("r1")).close_sync()
    path = state_dir / "r1.json"
    original = path.read_bytes()
    for length in range(len(original)):
        assert attempt_to_load(store, path, original[:length]) == [], length
    store.close_sync()


def test_a_flipped_byte_is_corrupt_or_harmless(state_dir: Path) -> None:
    """A checkpoint with any one byte altered is CheckpointCorrupt or loads the original state."""
    store = FileStore(state_dir, sync=False)
    store.create_sync(state_b("r1")).close_sync()
    path = state_dir / "r1.json"
    original = path.read_bytes()
    expected = store.read_sync("r1")
    rng = random.Random(20250304)
    corrupt = 0
    for _ in range(300):
        altered = bytearray(original)
        altered[rng.randrange(len(altered))] ^= rng.randrange(1, 256)
        loaded = attempt_to_load(store, path, bytes(altered))
        assert all(state == expected for state in loaded)
        corrupt += not loaded
    store.close_sync()
    assert corrupt > 250


def test_an_empty_state_file_is_corrupt(store: FileStore, state_dir: Path) -> None:
    """An empty RUN.json is CheckpointCorrupt saying so, never a fresh run."""
    store.create_sync(state_a("r1")).close_sync()
    (state_dir / "r1.json").write_bytes(b"")
    with pytest.raises(durably.CheckpointCorrupt, match="empty"):
        store.open_sync("r1")


def test_an_altered_state_is_caught_by_the_checksum(store: FileStore, state_dir: Path) -> None:
    """A state edited without updating its checksum is CheckpointCorrupt, not another run."""
    store.create_sync(state_a("r1")).close_sync()
    path = state_dir / "r1.json"
    path.write_bytes(path.read_bytes().replace(b"triage the flaky test", b"triage the flaky TEST"))
    with pytest.raises(durably.CheckpointCorrupt, match="checksum"):
        store.read_sync("r1")


def test_the_checkpoint_is_readable_json(store: FileStore, state_dir: Path) -> None:
    """The state file is plain JSON with the state inside, readable in any editor."""
    store.create_sync(state_a("r1")).close_sync()
    document = msgspec.json.decode((state_dir / "r1.json").read_bytes())
    assert document["durably"] == 1
    assert document["state"]["task"] == "triage the flaky test"


# -- a failing disk -----------------------------------------------------------------------------

BEFORE_RENAME = ["open", "write", "fsync file", "rename"]
ERRORS = [errno.EIO, errno.ENOSPC]


@pytest.mark.parametrize("err", ERRORS, ids=errno.errorcode.get)
@pytest.mark.parametrize("step", BEFORE_RENAME)
def test_a_save_failing_before_the_rename_keeps_the_old_state(
    state_dir: Path, step: str, err: int
) -> None:
    """A save whose temp open, write, fsync or rename fails is SaveFailed; the old state stays."""
    fs = FaultyFS(step, err, times=None)
    store = FileStore(state_dir, fs=fs)
    handle = store.create_sync(state_a("r1"))
    fs.armed = True
    for _ in range(2):
        with pytest.raises(durably.SaveFailed) as caught:
            handle.save_sync(state_b("r1"))
        assert os.strerror(err) in caught.value.reason
        assert isinstance(caught.value, durably.DurablyError)
    assert fs.failures == 2
    assert temp_files(state_dir) == []
    handle.close_sync()
    store.close_sync()
    fresh = FileStore(state_dir)
    reopened, loaded = fresh.open_sync("r1")
    reopened.close_sync()
    assert without_saved_at(loaded) == state_a("r1")
    assert temp_files(state_dir) == []


@pytest.mark.parametrize("err", ERRORS, ids=errno.errorcode.get)
@pytest.mark.parametrize("step", BEFORE_RENAME)
def test_a_save_that_failed_once_before_the_rename_can_be_retried(
    state_dir: Path, step: str, err: int
) -> None:
    """After one failed save before the rename, the same handle saves again and that state opens."""
    fs = FaultyFS(step, err, times=1)
    store = FileStore(state_dir, fs=fs)
    handle = store.create_sync(state_a("r1"))
    fs.armed = True
    with pytest.raises(durably.SaveFailed):
        handle.save_sync(state_b("r1"))
    handle.save_sync(state_b("r1"))
    handle.close_sync()
    store.close_sync()
    assert fs.failures == 1
    assert without_saved_at(FileStore(state_dir).read_sync("r1")) == state_b("r1")
    assert temp_files(state_dir) == []


@pytest.mark.parametrize("times", [1, None], ids=["once", "persistently"])
@pytest.mark.parametrize("err", ERRORS, ids=errno.errorcode.get)
def test_a_failed_directory_fsync_breaks_the_handle(
    state_dir: Path, err: int, times: int | None
) -> None:
    """After the directory fsync fails, the save is SaveFailed, the handle refuses every later save
    without touching the disk, the failed descriptor is never synced again, and the run opens as
    the old or the new state.
    """
    fs = FaultyFS("fsync dir", err, times=times)
    store = FileStore(state_dir, fs=fs)
    handle = store.create_sync(state_a("r1"))
    fs.armed = True
    with pytest.raises(durably.SaveFailed) as caught:
        handle.save_sync(state_b("r1"))
    assert os.strerror(err) in caught.value.reason
    failed_fd_syncs = len(fs.fsynced)
    with pytest.raises(durably.SaveFailed, match="an earlier save failed"):
        handle.save_sync(state_b("r1"))
    assert len(fs.fsynced) == failed_fd_syncs
    assert fs.failures == 1
    handle.close_sync()
    opens_before = fs.dir_opens
    fs.armed = False
    reopened, loaded = store.open_sync("r1")
    reopened.save_sync(state_b("r1"))
    reopened.close_sync()
    store.close_sync()
    assert fs.dir_opens == opens_before + 1, "the store opened a new directory descriptor"
    assert without_saved_at(loaded) in (state_a("r1"), state_b("r1"))
    assert temp_files(state_dir) == []


class _ThreadNoting(FileSystem):
    """The real file system, noting which thread renames (each save renames once)."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []

    def rename(self, src: str, dst: str, *, dir_fd: int) -> None:
        self.threads.append(threading.get_ident())
        super().rename(src, dst, dir_fd=dir_fd)


@pytest.mark.parametrize("sync", [True, False])
def test_only_a_synced_save_leaves_the_event_loop(tmp_path: Path, sync: bool) -> None:
    """A save that waits for the disk runs in a worker thread; an unsynced one runs at once."""
    fs = _ThreadNoting()
    store = FileStore(tmp_path, sync=sync, fs=fs)

    async def save_twice() -> None:
        handle = await store.create(state_a("r-1"))
        await handle.save(state_b("r-1"))
        await handle.close()

    asyncio.run(save_twice())
    loop_thread = threading.get_ident()
    assert len(fs.threads) == 2
    assert all((thread == loop_thread) is not sync for thread in fs.threads)
