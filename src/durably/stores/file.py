"""The snapshot file store: one JSON file per run, replaced whole on every save.

Layout of the state directory (mode 0700)::

    <run>.json     the run's state in a checksummed envelope (0600)
    <run>.lock     flock'ed by the process that owns the run (0600); never deleted
    .<run>.<16 hex>.tmp   a save in progress; removed by the run's next owner

Every save follows the crash-atomic protocol (:func:`durably._sysio.replace_file`,
shared with the workspace): write a temp file in the same directory (created
0600 with ``O_EXCL|O_NOFOLLOW``), fsync it, rename it over the run's file, fsync
the directory. At any instant the disk holds the old state or
the new one. A failed fsync means the save failed: the descriptor is never
synced again and the handle refuses further saves.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Self, TypeVar

from .. import faults
from .._sysio import (
    TEMP_TAIL,
    FileSystem,
    filesystem_type,
    is_network_fs,
    is_regular,
    is_temp_name,
    logger,
    replace_file,
)
from ..checkpoint.envelope import Opened, Sealer, open_sealed
from ..errors import (
    CheckpointCorrupt,
    Locked,
    LockLost,
    RunExists,
    RunNotFound,
    SaveFailed,
    UnsafePath,
    WrongStore,
)
from ..keys import RUN_ID_PATTERN, validate_run_id
from ..state import RunState, utcnow
from ._guard import check_parents, check_trusted, describe_kind, open_trusted

__all__ = ["FileRun", "FileStore"]

_T = TypeVar("_T")
_NOFOLLOW = os.O_NOFOLLOW
_STATE_SUFFIX = ".json"
_LOCK_SUFFIX = ".lock"


class FileStore:
    """Runs as JSON snapshot files in one directory on a local disk.

    Args:
        directory: the state directory; created (0700) and synced into its parent if missing.
        sync: fsync files and the directory. Turn off only in tests that do not
            care about power loss; a crash of the process alone is still safe.
        fs: the system-call seam (tests inject faults through it).
        allow_network_fs: use a network file system anyway, where ``flock`` may
            not exclude a process on another machine.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        sync: bool = True,
        fs: FileSystem | None = None,
        allow_network_fs: bool = False,
    ) -> None:
        self.directory = Path(directory)
        self.sync = sync
        self.fs = fs or FileSystem()
        self.allow_network_fs = allow_network_fs
        self._dir_fd: int | None = None

    # -- the Store protocol ------------------------------------------------------------

    async def create(self, state: RunState) -> FileRun:
        """Claim a new run ID, save its first state, and own it (``RunExists`` if used before)."""
        return await _off_the_loop(self.sync, self.create_sync, state)

    async def open(self, run_id: str) -> tuple[FileRun, RunState]:
        """Own an existing run and load its state (``Locked`` at once if owned elsewhere)."""
        return await _off_the_loop(self.sync, self.open_sync, run_id)

    async def read(self, run_id: str) -> RunState:
        """Load a run's state without taking its lock."""
        return await _off_the_loop(self.sync, self.read_sync, run_id)

    async def list_runs(self) -> list[str]:
        """The IDs of every run with a state file, sorted."""
        return await _off_the_loop(self.sync, self.list_runs_sync)

    def describe(self, run_id: str) -> str:
        """The path of the run's state file."""
        return str(self.directory / (run_id + _STATE_SUFFIX))

    # -- synchronous core (also used by the sweep and the power-loss model) -----------

    def create_sync(self, state: RunState) -> FileRun:
        """Blocking form of :meth:`create`."""
        run_id = validate_run_id(state.run_id)
        dir_fd = self._directory_fd()
        lock_name = run_id + _LOCK_SUFFIX
        self._refuse_symlink(lock_name, dir_fd)
        # The lock file may outlive a creator that died before its first save
        # returned: that ID never held a run, so taking it over reuses nothing.
        lock_fd = self._open_lock(lock_name, run_id, dir_fd)
        if not self.fs.lock(lock_fd):
            self.fs.close(lock_fd)
            raise Locked(run_id=run_id, path=self._path(lock_name))
        handle = self._new_handle(run_id, lock_fd)
        if self.fs.lstat(run_id + _STATE_SUFFIX, dir_fd=dir_fd) is not None:
            handle.close_sync()
            self._refuse_symlink(run_id + _STATE_SUFFIX, dir_fd)
            raise RunExists(run_id=run_id)
        self._remove_temp_files(run_id, dir_fd)
        self._remove_orphaned_temp_files(dir_fd)
        try:
            handle.save_sync(state)
        except BaseException:
            handle.close_sync()
            raise
        return handle

    def open_sync(self, run_id: str) -> tuple[FileRun, RunState]:
        """Blocking form of :meth:`open`."""
        validate_run_id(run_id)
        dir_fd = self._directory_fd()
        lock_name = run_id + _LOCK_SUFFIX
        if self.fs.lstat(run_id + _STATE_SUFFIX, dir_fd=dir_fd) is None:
            self._refuse_symlink(lock_name, dir_fd)
            raise RunNotFound(run_id=run_id, where=str(self.directory))
        self._refuse_symlink(run_id + _STATE_SUFFIX, dir_fd)
        # O_CREAT: a power cut may keep the first save's rename but not the lock
        # file's creation (directory operations on different names can persist
        # out of order); the state file is what proves the run exists.
        lock_fd = self._open_lock(lock_name, run_id, dir_fd)
        if not self.fs.lock(lock_fd):
            self.fs.close(lock_fd)
            raise Locked(run_id=run_id, path=self._path(lock_name))
        handle = self._new_handle(run_id, lock_fd)
        try:
            self._remove_temp_files(run_id, dir_fd)
            state = self._load(run_id, dir_fd, owner=handle)
        except BaseException:
            handle.close_sync()
            raise
        return handle, state

    def read_sync(self, run_id: str) -> RunState:
        """Blocking form of :meth:`read`."""
        validate_run_id(run_id)
        if self._dir_fd is None and not os.path.lexists(self.directory):
            # A reader never creates the state directory (a mistyped --state stays a mistake).
            raise RunNotFound(run_id=run_id, where=str(self.directory))
        return self._load(run_id, self._directory_fd())

    def list_runs_sync(self) -> list[str]:
        """Blocking form of :meth:`list_runs`."""
        if not self.directory.exists() and not self.directory.is_symlink():
            return []
        names = self.fs.listdir(self._directory_fd())
        return sorted(
            name[: -len(_STATE_SUFFIX)]
            for name in names
            if name.endswith(_STATE_SUFFIX) and not name.startswith(".")
        )

    async def close(self) -> None:
        """Close the store's directory descriptor.

        Handles keep their own lock descriptors and stay usable, and the store
        opens its directory again if it is used after this. Closing twice is harmless.
        """
        self.close_sync()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def close_sync(self) -> None:
        """Blocking form of :meth:`close`, for callers without an event loop.

        The sweeps and the LangGraph saver's sync API call it.
        """
        if self._dir_fd is not None:
            self.fs.close(self._dir_fd)
            self._dir_fd = None

    # -- internals --------------------------------------------------------------------

    def _path(self, name: str) -> str:
        return str(self.directory / name)

    def _directory_fd(self) -> int:
        if self._dir_fd is None:
            self._dir_fd = self._open_directory()
        return self._dir_fd

    def _open_directory(self) -> int:
        path = str(self.directory)
        check_parents(path)  # before anything is made or read in it
        if not self.directory.exists() and not self.directory.is_symlink():
            self._make_directory()
        try:
            fd = self.fs.open_dir(path)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise UnsafePath(path=path, reason="not a directory (or a symlink)") from exc
            raise SaveFailed(run_id="-", path=path, reason=os.strerror(exc.errno or 0)) from exc
        try:
            check_trusted(os.fstat(fd), path=path, directory=True)
        except BaseException:
            self.fs.close(fd)
            raise
        fs_type = filesystem_type(path)
        if is_network_fs(fs_type) and not self.allow_network_fs:
            self.fs.close(fd)
            raise UnsafePath(
                path=path,
                reason=f"it is on a network file system ({fs_type}) where flock does not "
                "exclude other machines; use PostgresStore, or allow_network_fs=True "
                "if only one machine uses it",
            )
        return fd

    def _make_directory(self) -> None:
        """Create the state directory (0700) and sync it into its parent.

        Missing parents are made the same way (0700 too, whatever the umask), each
        synced into its own parent: an unsynced parent can vanish in a power cut,
        taking with it runs whose saves returned.
        """
        missing = [self.directory]
        while not missing[-1].parent.exists():
            missing.append(missing[-1].parent)
        for directory in reversed(missing):
            is_state_dir = directory == self.directory
            try:
                self.fs.mkdir(str(directory), 0o700)
            except FileExistsError:
                if is_state_dir:
                    return
                continue
            # A umask can only remove bits; chmod gives exactly 0700 whatever it was.
            os.chmod(directory, 0o700, follow_symlinks=False)
            if self.sync:
                parent_fd = self.fs.open_dir(str(directory.parent))
                try:
                    self.fs.fsync(parent_fd)
                finally:
                    self.fs.close(parent_fd)

    def _refuse_symlink(self, name: str, dir_fd: int) -> None:
        info = self.fs.lstat(name, dir_fd=dir_fd)
        if info is not None and not is_regular(info):
            kind = describe_kind(info.st_mode)
            raise UnsafePath(path=self._path(name), reason=f"it is not a regular file ({kind})")

    def _remove_temp_files(self, run_id: str, dir_fd: int) -> None:
        """Remove this run's own temp files: exactly ``.<run>.<16 hex>.tmp``.

        Never another run's: run ``a`` must not touch ``.a.b.<16 hex>.tmp`` (the
        stem is what is left once the fixed-length tail is cut, so it is exact).
        """
        for name in self.fs.listdir(dir_fd):
            if is_temp_name(name, run_id):
                try:
                    self.fs.unlink(name, dir_fd=dir_fd)
                except FileNotFoundError:
                    continue
                logger("durably.store").info("removed %s left by a save that never finished", name)

    def _remove_orphaned_temp_files(self, dir_fd: int) -> None:
        """Remove temp files of runs whose first save never finished (no state file).

        Such a run has no next owner to clean up after it: a creator that was
        killed inside its first save leaves a run ID nobody will open. Its temp
        is removed only while its lock is held here (so a creator still writing
        is left alone) and its state file is still absent.
        """
        for name in self.fs.listdir(dir_fd):
            if not is_temp_name(name):
                continue
            run_id = name[1:-TEMP_TAIL]
            if RUN_ID_PATTERN.fullmatch(run_id) is None:
                continue
            if self.fs.lstat(run_id + _STATE_SUFFIX, dir_fd=dir_fd) is not None:
                continue
            try:
                lock_fd = self.fs.open(
                    run_id + _LOCK_SUFFIX, os.O_RDWR | _NOFOLLOW, 0o600, dir_fd=dir_fd
                )
            except OSError:
                continue  # no lock file: nobody can be writing it, but leave it to its owner
            try:
                if self.fs.lock(lock_fd) and (
                    self.fs.lstat(run_id + _STATE_SUFFIX, dir_fd=dir_fd) is None
                ):
                    self._remove_temp_files(run_id, dir_fd)
            finally:
                self.fs.close(lock_fd)

    def _new_handle(self, run_id: str, lock_fd: int) -> FileRun:
        return FileRun(self, run_id, lock_fd)

    def _load(self, run_id: str, dir_fd: int, *, owner: FileRun | None = None) -> RunState:
        """Load a run's state; ``owner`` is the handle when the run is opened (locked)."""
        opened, _ = self._read_snapshot(run_id, dir_fd)
        if opened.journal:
            raise WrongStore(path=self.describe(run_id), store="journal")
        return opened.state

    def _read_snapshot(self, run_id: str, dir_fd: int) -> tuple[Opened, int]:
        """The checked snapshot and its size in bytes."""
        name = run_id + _STATE_SUFFIX
        path = self._path(name)
        data = self._read_trusted(name, run_id, dir_fd)
        if data is None:
            raise RunNotFound(run_id=run_id, where=str(self.directory))
        opened = open_sealed(data, path=path)
        if opened.state.run_id != run_id:
            raise CheckpointCorrupt(
                path=path, reason=f"it holds run {opened.state.run_id!r}, not {run_id!r}"
            )
        return opened, len(data)

    def _read_trusted(self, name: str, run_id: str, dir_fd: int) -> bytes | None:
        """The whole of a regular file of ours in the state directory; None if there is none."""
        try:
            fd = open_trusted(self.fs, name, os.O_RDONLY, 0, dir_fd=dir_fd, path=self._path(name))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._translate(exc, name, run_id) from exc
        try:
            return self.fs.read(fd)
        finally:
            self.fs.close(fd)

    def _open_lock(self, lock_name: str, run_id: str, dir_fd: int) -> int:
        try:
            return open_trusted(
                self.fs,
                lock_name,
                os.O_RDWR | os.O_CREAT,
                0o600,
                dir_fd=dir_fd,
                path=self._path(lock_name),
            )
        except OSError as exc:
            raise self._translate(exc, lock_name, run_id) from exc

    def _translate(self, exc: OSError, name: str, run_id: str) -> Exception:
        path = self._path(name)
        if exc.errno == errno.ELOOP:
            return UnsafePath(path=path, reason="it is a symlink")
        if exc.errno == errno.EISDIR:
            return UnsafePath(path=path, reason="a directory stands there")
        if exc.errno == errno.ENXIO:  # O_NONBLOCK write-open of a FIFO with no reader
            return UnsafePath(path=path, reason="it is not a regular file (a FIFO or socket)")
        return SaveFailed(run_id=run_id, path=path, reason=os.strerror(exc.errno or 0))


class FileRun:
    """Ownership of one run in a :class:`FileStore`: holds its flock until closed."""

    def __init__(self, store: FileStore, run_id: str, lock_fd: int) -> None:
        self._store = store
        self._run_id = run_id
        self._lock_fd: int | None = lock_fd
        self._broken: str | None = None
        info = os.fstat(lock_fd)
        self._lock_inode = (info.st_dev, info.st_ino)
        self._sealer = Sealer()
        """Keeps the last snapshot's encoded messages: a save encodes only the new ones."""

    @property
    def run_id(self) -> str:
        """The run this handle owns."""
        return self._run_id

    async def save(self, state: RunState) -> None:
        """Make ``state`` the run's durable state (crash-atomic; see the module docstring)."""
        await _off_the_loop(self._store.sync, self.save_sync, state)

    def save_without_waiting(self, state: RunState) -> bool:
        """Save ``state`` now if this store's saves wait for nothing; whether it did.

        A store that does not sync writes to the page cache and returns, so the
        agent's loop saves through this first, without the task and the shield
        an awaited save needs (which cost more than such a save; a crash sweep
        makes thousands). A store that syncs returns False at once, having done
        nothing, and the loop awaits :meth:`save`.
        """
        if self._store.sync:
            return False
        self.save_sync(state)
        return True

    async def close(self) -> None:
        """Release the lock (the lock file stays: deleting it would race a new opener)."""
        await _off_the_loop(self._store.sync, self.close_sync)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def close_sync(self) -> None:
        """Blocking form of :meth:`close`."""
        if self._lock_fd is not None:
            self._store.fs.close(self._lock_fd)
            self._lock_fd = None
        self._sealer = Sealer()  # let the kept bytes go with the handle's lock

    def save_sync(self, state: RunState) -> None:
        """Blocking form of :meth:`save`."""
        self._check_usable()
        state.saved_at = utcnow()
        self._write_snapshot(self._sealer.seal(state))

    def _check_usable(self) -> None:
        if self._lock_fd is None:
            raise SaveFailed(
                run_id=self._run_id, path=self._store.describe(self._run_id), reason="closed"
            )
        if self._broken is not None:
            raise SaveFailed(
                run_id=self._run_id,
                path=self._store.describe(self._run_id),
                reason=f"an earlier save failed ({self._broken}); reopen the run",
            )
        self._check_lock_path()

    def _check_lock_path(self) -> None:
        """Stop when the lock file's name no longer leads to the file this handle locked.

        A tmp cleaner (or a person) that deletes or replaces a held lock file lets
        the next opener create a new one and lock it too: two owners. Comparing the
        locked descriptor's inode with the name's before each save costs one
        ``lstat`` and makes this owner stop before writing anything.
        """
        store = self._store
        lock_name = self._run_id + _LOCK_SUFFIX
        try:
            info = store.fs.lstat(lock_name, dir_fd=store._directory_fd())  # noqa: SLF001 -- the run handle is part of its store (same module)
        except OSError:
            info = None
        if info is None or (info.st_dev, info.st_ino) != self._lock_inode:
            self._broken = "the lock file was deleted or replaced while held"
            raise LockLost(run_id=self._run_id, path=store._path(lock_name))  # noqa: SLF001 -- the run handle is part of its store (same module)

    def _write_snapshot(self, data: bytes) -> None:
        """Replace the run's snapshot file with ``data`` by the crash-atomic protocol."""
        store = self._store
        dir_fd = store._directory_fd()  # noqa: SLF001 -- the run handle is part of its store (same module)
        name = self._run_id + _STATE_SUFFIX
        store._refuse_symlink(name, dir_fd)  # noqa: SLF001 -- the run handle is part of its store (same module)
        replace_file(
            store.fs,
            dir_fd,
            name,
            data,
            mode=0o600,
            sync=store.sync,
            point=_save_point,
            on_error=self._failed,
            directory=str(store.directory),
            stem=self._run_id,
        )

    def _failed(self, exc: OSError, name: str, fatal: bool) -> Exception:
        """The exception a failed system call of a save raises (see :meth:`_step`)."""
        reason = f"{os.strerror(exc.errno or 0)} on {name}"
        if fatal:
            self._broken = reason
            self._store.close_sync()
        if exc.errno == errno.ELOOP or isinstance(exc, FileExistsError):
            return UnsafePath(path=self._store._path(name), reason="something is in the way")  # noqa: SLF001 -- the run handle is part of its store (same module)
        return SaveFailed(
            run_id=self._run_id, path=self._store.describe(self._run_id), reason=reason
        )

    def _step(self, action: Callable[[], _T], name: str, *, fatal: bool = False) -> _T:
        """Run one system call of a save, turning its failure into ``SaveFailed``.

        A failed directory fsync (``fatal``) breaks the handle and drops the
        directory descriptor: the kernel may already have dropped the dirty
        pages and cleared the error, so syncing the same descriptor again and
        trusting the answer would claim durability that does not exist. (A failed
        fsync of a temp file needs no such care: that file is discarded.)
        """
        try:
            return action()
        except OSError as exc:
            raise self._failed(exc, name, fatal) from exc


def _save_point(step: str) -> None:
    faults.point(f"store.save.{step}")


async def _off_the_loop(sync: bool, function: Callable[..., _T], *arguments: object) -> _T:
    """Run blocking store I/O in a worker thread, or at once when the store does not sync.

    A synced save waits for the disk, which must not stall the event loop.
    Without syncs it is a few writes to the page cache, cheaper than the hop to
    a worker thread and back (which the crash sweep would pay thousands of
    times); the crash points inside are reached the same way either way.
    """
    if sync:
        import asyncio  # imported where it runs: `import durably` stays light (issue 19)

        return await asyncio.to_thread(function, *arguments)
    return function(*arguments)
