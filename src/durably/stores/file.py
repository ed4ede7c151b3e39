"""The snapshot file store: one JSON file per run, replaced whole on every save.

Layout of the state directory (mode 0700)::

    <run>.json     the run's state in a checksummed envelope (0600)
    <run>.lock     flock'ed by the process that owns the run (0600); deleted only by prune
    <run>.cancel   ``durably cancel`` asks the owner to stop (0600, empty)
    .<run>.<16 hex>.tmp   a save in progress; removed by the run's next owner
    .<run>.pruned  a pruned run's state, renamed: the run is gone, its files going

Every save follows the crash-atomic protocol (:func:`durably._sysio.replace_file`,
shared with the workspace): write a temp file in the same directory (created
0600 with ``O_EXCL|O_NOFOLLOW``), fsync it, rename it over the run's file, fsync
the directory. At any instant the disk holds the old state or
the new one. A failed fsync means the save failed: the descriptor is never
synced again and the handle refuses further saves.

The store is also :class:`~durably.stores.Housekeeping`: :meth:`FileStore.cancel`
and :meth:`FileStore.prune` (docs/design.md, "Cancel and prune on the file stores").
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Self, TypeVar

from .. import faults
from .._sysio import FileSystem, logger
from ..checkpoint.envelope import Opened, Sealer, open_sealed
from ..errors import (
    CheckpointCorrupt,
    DurablyError,
    Locked,
    RunExists,
    RunNotFound,
    SaveFailed,
    WrongStore,
)
from ..keys import RUN_ID_PATTERN, validate_run_id
from ..state import Phase, RunState, utcnow
from . import CancelOutcome, PruneReport
from .rundir import LOCK_SUFFIX, STATE_SUFFIX, Claim, RunDirectory, off_the_loop, tombstone_name

__all__ = ["FileRun", "FileStore"]

_T = TypeVar("_T")
_STATE_SUFFIX = STATE_SUFFIX
_LOCK_SUFFIX = LOCK_SUFFIX


class FileStore:
    """Runs as JSON snapshot files in one directory on a local disk.

    The store holds a :class:`~durably.stores.rundir.RunDirectory` for everything
    about the directory (its descriptor, trust checks, locks, temp files, errors);
    what is its own is the layout of a run: one snapshot file.

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
        self.run_directory = RunDirectory(
            directory,
            sync=sync,
            fs=fs or FileSystem(),
            allow_network_fs=allow_network_fs,
            make=self._make_directory,
        )
        """The directory the runs are in, held (shared mechanics: see its module)."""

    @property
    def directory(self) -> Path:
        """The state directory."""
        return self.run_directory.directory

    @property
    def sync(self) -> bool:
        """Whether files and the directory are synced."""
        return self.run_directory.sync

    @sync.setter
    def sync(self, sync: bool) -> None:
        self.run_directory.sync = sync

    @property
    def fs(self) -> FileSystem:
        """The system-call seam every call of the store goes through."""
        return self.run_directory.fs

    @fs.setter
    def fs(self, fs: FileSystem) -> None:
        self.run_directory.fs = fs

    @property
    def allow_network_fs(self) -> bool:
        """Whether a network file system is used anyway."""
        return self.run_directory.allow_network_fs

    # -- the Store protocol ------------------------------------------------------------

    async def create(self, state: RunState) -> FileRun:
        """Claim a new run ID, save its first state, and own it (``RunExists`` if used before)."""
        return await off_the_loop(self.sync, self.create_sync, state)

    async def open(self, run_id: str) -> tuple[FileRun, RunState]:
        """Own an existing run and load its state (``Locked`` at once if owned elsewhere)."""
        return await off_the_loop(self.sync, self.open_sync, run_id)

    async def read(self, run_id: str) -> RunState:
        """Load a run's state without taking its lock."""
        return await off_the_loop(self.sync, self.read_sync, run_id)

    async def list_runs(self) -> list[str]:
        """The IDs of every run with a state file, sorted."""
        return await off_the_loop(self.sync, self.list_runs_sync)

    def describe(self, run_id: str) -> str:
        """The path of the run's state file."""
        return str(self.directory / (run_id + _STATE_SUFFIX))

    # -- synchronous core (also used by the sweep and the power-loss model) -----------

    def create_sync(self, state: RunState) -> FileRun:
        """Blocking form of :meth:`create`."""
        run_id = validate_run_id(state.run_id)
        directory = self.run_directory
        dir_fd = directory.fd()
        lock_name = run_id + _LOCK_SUFFIX
        directory.refuse_symlink(lock_name)
        # The lock file may outlive a creator that died before its first save
        # returned: that ID never held a run, so taking it over reuses nothing.
        lock_fd = directory.lock(lock_name, run_id)
        if lock_fd is None:
            raise Locked(run_id=run_id, path=directory.path(lock_name))
        handle = self._new_handle(run_id, lock_fd)
        if self.fs.lstat(run_id + _STATE_SUFFIX, dir_fd=dir_fd) is not None:
            handle.close_sync()
            directory.refuse_symlink(run_id + _STATE_SUFFIX)
            raise RunExists(run_id=run_id)
        try:
            # An ID used again after a prune: what a killed prune left of the old run
            # goes first (a journal run's new log must never meet an old one), and a
            # request to cancel the old run is not one to cancel this new one.
            directory.finish_tombstone(run_id, remove_lock=False)
            directory.remove_cancel_request(run_id)
        except OSError as exc:
            handle.close_sync()
            raise directory.translate(exc, run_id + _STATE_SUFFIX, run_id) from exc
        directory.remove_temp_files(run_id)
        directory.remove_orphaned_temp_files()
        try:
            handle.save_sync(state)
        except BaseException:
            handle.close_sync()
            raise
        return handle

    def open_sync(self, run_id: str) -> tuple[FileRun, RunState]:
        """Blocking form of :meth:`open`."""
        validate_run_id(run_id)
        directory = self.run_directory
        dir_fd = directory.fd()
        lock_name = run_id + _LOCK_SUFFIX
        if self.fs.lstat(run_id + _STATE_SUFFIX, dir_fd=dir_fd) is None:
            directory.refuse_symlink(lock_name)
            if self.fs.lstat(tombstone_name(run_id), dir_fd=dir_fd) is not None:
                self._finish_pruned(run_id)  # a prune was killed on this run: it is gone
            raise RunNotFound(run_id=run_id, where=str(self.directory))
        directory.refuse_symlink(run_id + _STATE_SUFFIX)
        # O_CREAT: a power cut may keep the first save's rename but not the lock
        # file's creation (directory operations on different names can persist
        # out of order); the state file is what proves the run exists.
        lock_fd = directory.lock(lock_name, run_id)
        if lock_fd is None:
            raise Locked(run_id=run_id, path=directory.path(lock_name))
        handle = self._new_handle(run_id, lock_fd)
        try:
            directory.remove_temp_files(run_id)
            state = self._load(run_id, owner=handle)
        except BaseException:
            handle.close_sync()
            raise
        return handle, state

    def read_sync(self, run_id: str) -> RunState:
        """Blocking form of :meth:`read`."""
        validate_run_id(run_id)
        if not self.run_directory.is_open and not os.path.lexists(self.directory):
            # A reader never creates the state directory (a mistyped --state stays a mistake).
            raise RunNotFound(run_id=run_id, where=str(self.directory))
        return self._load(run_id)

    def list_runs_sync(self) -> list[str]:
        """Blocking form of :meth:`list_runs`."""
        if not self.directory.exists() and not self.directory.is_symlink():
            return []
        names = self.fs.listdir(self.run_directory.fd())
        return sorted(
            name[: -len(_STATE_SUFFIX)]
            for name in names
            if name.endswith(_STATE_SUFFIX) and not name.startswith(".")
        )

    # -- Housekeeping: cancel and prune ------------------------------------------------

    async def cancel(self, run_id: str) -> CancelOutcome:
        """Stop ``run_id``: at once if nobody owns it, else after its owner's current save.

        A run nobody holds (paused, or its process died) is saved as ``cancelled``
        under its lock. A held run gets ``<run>.cancel``, created and synced; its
        owner looks for it after each save with no call in flight and ends the run.

        Raises:
            RunNotFound: there is no such run.
        """
        return await off_the_loop(self.sync, self.cancel_sync, run_id)

    async def prune(self, *, older_than: timedelta, now: datetime | None = None) -> PruneReport:
        """Delete every finished run (``done``, ``cancelled``) saved before ``now - older_than``.

        Never a run that is not finished, nor one a process holds (reported as
        ``owned``). Each run is locked and read again first; its state file is
        renamed to a hidden tombstone (the commit point), then its logs, temp
        files and cancel request are removed (and synced away), then its lock
        file and, last, the tombstone.
        A kill at any instant leaves each run whole or gone; the next prune (or
        an open of its ID) finishes what a killed one left.

        Args:
            older_than: how long ago a finished run was last saved, at least.
            now: the time to count from (timezone-aware); default: now, in UTC.
        """
        return await off_the_loop(self.sync, self.prune_sync, older_than, now)

    def cancel_sync(self, run_id: str) -> CancelOutcome:
        """Blocking form of :meth:`cancel`."""
        validate_run_id(run_id)
        if not self.run_directory.is_open and not os.path.lexists(self.directory):
            raise RunNotFound(run_id=run_id, where=str(self.directory))
        done = self._cancel_unowned(run_id)
        if done is not None:
            return done
        if self._load(run_id).phase.finished:  # read without the lock: its owner has it
            return CancelOutcome.FINISHED
        self.run_directory.request_cancel(run_id, run_id)
        # The owner may have let go between the two looks and would never see the
        # request: then the lock is free, and the run is cancelled here after all.
        done = self._cancel_unowned(run_id)
        return CancelOutcome.REQUESTED if done is None else done

    def _cancel_unowned(self, run_id: str) -> CancelOutcome | None:
        """Cancel ``run_id`` under its lock; None when a process holds it."""
        try:
            handle, state = self.open_sync(run_id)
        except Locked:
            return None
        try:
            if state.phase.finished:
                outcome = CancelOutcome.FINISHED
            else:
                state.cancel()
                handle.save_sync(state)  # removes a request the owner left unserved
                outcome = CancelOutcome.CANCELLED
        finally:
            handle.close_sync()
        return outcome

    def prune_sync(self, older_than: timedelta, now: datetime | None = None) -> PruneReport:
        """Blocking form of :meth:`prune`."""
        cutoff = (now or utcnow()) - older_than
        if not self.directory.exists() and not self.directory.is_symlink():
            return PruneReport(pruned=())
        directory = self.run_directory
        names = self.fs.listdir(directory.fd())
        for run_id in directory.tombstones(names):  # left by a prune that was killed
            self._finish_pruned(run_id)
        runs = sorted(
            name[: -len(_STATE_SUFFIX)]
            for name in names
            if name.endswith(_STATE_SUFFIX)
            and not name.startswith(".")
            and RUN_ID_PATTERN.fullmatch(name[: -len(_STATE_SUFFIX)]) is not None
        )
        pruned: list[str] = []
        owned: list[str] = []
        for run_id in runs:
            # A look without the lock first: an unfinished run is never locked here,
            # so its owner's next open never meets a prune's lock.
            if not _prunable(self._read_quietly(run_id, names), cutoff):
                continue
            lock_fd = directory.lock(run_id + _LOCK_SUFFIX, run_id)
            if lock_fd is None:
                owned.append(run_id)
                continue
            try:
                # Read again under the lock: it may have changed since the first look.
                if _prunable(self._read_quietly(run_id, None), cutoff):
                    faults.point("store.prune.locked")
                    self._step(partial(self._bury, run_id), run_id)
                    pruned.append(run_id)
            finally:
                self.fs.close(lock_fd)
        return PruneReport(pruned=tuple(pruned), owned=tuple(owned))

    def _bury(self, run_id: str) -> None:
        """Prune one run whose lock is held here (see :meth:`prune`)."""
        directory = self.run_directory
        directory.bury(run_id)
        directory.finish_tombstone(run_id, remove_lock=True)

    def _finish_pruned(self, run_id: str) -> None:
        """Finish the prune of ``run_id`` whose tombstone is left, unless someone holds it."""
        directory = self.run_directory
        lock_fd = directory.lock(run_id + _LOCK_SUFFIX, run_id)
        if lock_fd is None:
            return  # a prune (or an open) is finishing it now
        try:
            self._step(partial(directory.finish_tombstone, run_id, remove_lock=True), run_id)
        finally:
            self.fs.close(lock_fd)

    def _step(self, action: Callable[[], object], run_id: str) -> None:
        """Run a prune's file operations, a failed system call said as ``SaveFailed``."""
        try:
            action()
        except OSError as exc:
            raise SaveFailed(
                run_id=run_id,
                path=self.describe(run_id),
                reason=f"pruning it: {os.strerror(exc.errno or 0)} "
                "(run the prune again: it finishes what it started)",
            ) from exc

    def _read_quietly(self, run_id: str, names: Sequence[str] | None) -> RunState | None:
        """The run's state for prune, or None (logged) when it cannot be read: never pruned."""
        try:
            return self._read_listed(run_id, names)
        except RunNotFound:
            return None
        except DurablyError as exc:
            logger("durably.store").warning("prune leaves run %s: %s", run_id, exc)
            return None

    def _read_listed(self, run_id: str, names: Sequence[str] | None) -> RunState:
        """:meth:`read_sync`; a store that can use a listing of the directory does."""
        return self.read_sync(run_id)

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
        self.run_directory.close()

    # -- the steps the power-loss model's seeded mutants replace -----------------------

    def _directory_fd(self) -> int:
        return self.run_directory.fd()

    def _make_directory(self) -> None:
        self.run_directory.make()

    def _new_handle(self, run_id: str, lock_fd: int) -> FileRun:
        return FileRun(self, run_id, lock_fd)

    # -- reading -----------------------------------------------------------------------

    def _load(self, run_id: str, *, owner: FileRun | None = None) -> RunState:
        """Load a run's state; ``owner`` is the handle when the run is opened (locked)."""
        opened, _ = self._read_snapshot(run_id)
        if opened.journal:
            raise WrongStore(path=self.describe(run_id), store="journal")
        return opened.state

    def _read_snapshot(self, run_id: str) -> tuple[Opened, int]:
        """The run's checked snapshot and its size in bytes (``RunNotFound`` if none)."""
        name = run_id + _STATE_SUFFIX
        path = self.run_directory.path(name)
        data = self.run_directory.read_trusted(name, run_id)
        if data is None:
            raise RunNotFound(run_id=run_id, where=str(self.directory))
        opened = open_sealed(data, path=path)
        if opened.state.run_id != run_id:
            raise CheckpointCorrupt(
                path=path, reason=f"it holds run {opened.state.run_id!r}, not {run_id!r}"
            )
        return opened, len(data)


class FileRun:
    """Ownership of one run in a :class:`FileStore`: holds its flock until closed.

    It holds a :class:`~durably.stores.rundir.Claim` (the lock, the checks before
    each save, the errors of a failed step); what is its own is the save: one
    snapshot replaced crash-atomically.
    """

    def __init__(self, store: FileStore, run_id: str, lock_fd: int) -> None:
        self._store = store
        self._run_id = run_id
        self.claim = Claim(store.run_directory, run_id, lock_fd)
        """The run's lock as this handle holds it."""
        self._sealer = Sealer()
        """Keeps the last snapshot's encoded messages: a save encodes only the new ones."""

    @property
    def run_id(self) -> str:
        """The run this handle owns."""
        return self._run_id

    @property
    def _lock_fd(self) -> int | None:
        """The lock's descriptor (None once closed); the power-loss model reads it."""
        return self.claim.lock_fd

    async def save(self, state: RunState) -> None:
        """Make ``state`` the run's durable state (crash-atomic; see the module docstring)."""
        await off_the_loop(self._store.sync, self.save_sync, state)

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
        await off_the_loop(self._store.sync, self.close_sync)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def close_sync(self) -> None:
        """Blocking form of :meth:`close`."""
        self.claim.release()
        self._sealer = Sealer()  # let the kept bytes go with the handle's lock

    def save_sync(self, state: RunState) -> None:
        """Blocking form of :meth:`save`."""
        self.claim.check_usable()
        state.saved_at = utcnow()
        self._write_snapshot(self._sealer.seal(state))
        self._served(state)

    def cancel_requested(self) -> bool:
        """Whether ``durably cancel`` asked this owner to stop (one ``lstat``: ``<run>.cancel``)."""
        return self.claim.directory.cancel_requested(self._run_id)

    def _served(self, state: RunState) -> None:
        """After a durable save: a cancelled run's request has been served, and goes."""
        if state.phase is Phase.CANCELLED:
            self.claim.step(
                lambda: self.claim.directory.remove_cancel_request(self._run_id),
                self._run_id + ".cancel",
            )

    def _write_snapshot(self, data: bytes) -> None:
        """Replace the run's snapshot file with ``data`` by the crash-atomic protocol."""
        self.claim.replace(self._run_id + _STATE_SUFFIX, data)


def _prunable(state: RunState | None, cutoff: datetime) -> bool:
    """Whether prune takes a run: finished, and last saved before ``cutoff``."""
    return (
        state is not None
        and state.phase.finished
        and state.saved_at is not None
        and state.saved_at < cutoff
    )
