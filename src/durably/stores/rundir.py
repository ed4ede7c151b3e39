"""A run directory: the state directory the file stores keep their runs in, handled once.

The snapshot store (:mod:`durably.stores.file`), the journal store
(:mod:`durably.stores.journal`) and the LangGraph saver's thread store each *hold*
a :class:`RunDirectory` for what concerns the directory rather than what a file
holds: its descriptor (opened once, the directory made 0700 and synced into its
parent if missing, refused on a network file system), the trust checks
(:mod:`durably.stores._guard`: the user's own, nobody else can write), the lock
files and their ``flock``, the removal of temp files a killed save left, the
crash-atomic replacement of a file (:func:`durably._sysio.replace_file`), and
the translation of a failed system call into durably's errors.

Each handle that owns a run holds a :class:`Claim`: the locked descriptor, the
checks made before each save (closed, broken by an earlier failure, lock file
deleted or replaced while held) and the error a failed step of a save raises.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import TypeVar

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
from ..errors import LockLost, SaveFailed, UnsafePath
from ..keys import RUN_ID_PATTERN
from ._guard import check_parents, check_trusted, describe_kind, open_trusted

__all__ = ["Claim", "RunDirectory", "off_the_loop", "tombstone_name"]

_T = TypeVar("_T")
_NOFOLLOW = os.O_NOFOLLOW
STATE_SUFFIX = ".json"
"""A run's (or a thread's) snapshot or header file: ``<stem>.json``."""
LOCK_SUFFIX = ".lock"
"""A run's lock file, ``<stem>.lock``: flock'ed by its owner, never deleted."""
CANCEL_SUFFIX = ".cancel"
"""``<stem>.cancel``: ``durably cancel`` asks the run's owner to stop (empty, 0600)."""
TOMBSTONE_SUFFIX = ".pruned"
"""``.<stem>.pruned``: a pruned run's state file, renamed: the run is gone, its files going."""
_RESERVING_FS = frozenset({"ext4", "xfs"})
"""File systems where writing into reserved space spares the sync a journal commit."""


class RunDirectory:
    """One state directory on a local disk, as the file stores use it.

    Args:
        directory: the state directory; created (0700) and synced into its parent if missing.
        sync: fsync files and the directory (off only in tests that do not model power loss).
        fs: the system-call seam; stores read it here at each call, so a test may swap it.
        allow_network_fs: use a network file system anyway, where ``flock`` may
            not exclude a process on another machine.
        make: makes the missing directory; :meth:`make` when None. The snapshot store
            passes its own step, which the power-loss model's seeded mutants replace.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        sync: bool,
        fs: FileSystem,
        allow_network_fs: bool,
        make: Callable[[], None] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.sync = sync
        self.fs = fs
        self.allow_network_fs = allow_network_fs
        self._make = make or self.make
        self._fd: int | None = None
        self._reserves: bool | None = None

    @property
    def is_open(self) -> bool:
        """True while the directory's descriptor is open."""
        return self._fd is not None

    def reserves_space(self) -> bool:
        """True when logs here get space reserved ahead of their end (ext4 and xfs)."""
        if self._reserves is None:
            self._reserves = filesystem_type(self.directory) in _RESERVING_FS
        return self._reserves

    def path(self, name: str) -> str:
        """The path of ``name`` in the directory, for messages."""
        return str(self.directory / name)

    def fd(self) -> int:
        """The directory's descriptor, opened (and the directory made) on first use."""
        if self._fd is None:
            self._fd = self._open()
        return self._fd

    def close(self) -> None:
        """Close the directory's descriptor (it is opened again on next use)."""
        if self._fd is not None:
            self.fs.close(self._fd)
            self._fd = None

    def _open(self) -> int:
        path = str(self.directory)
        check_parents(path)  # before anything is made or read in it
        if not self.directory.exists() and not self.directory.is_symlink():
            self._make()
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

    def make(self) -> None:
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

    def refuse_symlink(self, name: str) -> None:
        """Refuse ``name`` when something other than a regular file stands there."""
        info = self.fs.lstat(name, dir_fd=self.fd())
        if info is not None and not is_regular(info):
            kind = describe_kind(info.st_mode)
            raise UnsafePath(path=self.path(name), reason=f"it is not a regular file ({kind})")

    def lock(self, lock_name: str, run_id: str) -> int | None:
        """Open (or create) a lock file of ours and ``flock`` it without waiting.

        Returns its descriptor, or None (having closed it) when another process holds it.
        """
        try:
            lock_fd = open_trusted(
                self.fs,
                lock_name,
                os.O_RDWR | os.O_CREAT,
                0o600,
                dir_fd=self.fd(),
                path=self.path(lock_name),
            )
        except OSError as exc:
            raise self.translate(exc, lock_name, run_id) from exc
        if not self.fs.lock(lock_fd):
            self.fs.close(lock_fd)
            return None
        return lock_fd

    def read_trusted(self, name: str, run_id: str) -> bytes | None:
        """The whole of a regular file of ours in the directory; None if there is none."""
        try:
            fd = open_trusted(self.fs, name, os.O_RDONLY, 0, dir_fd=self.fd(), path=self.path(name))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self.translate(exc, name, run_id) from exc
        try:
            return self.fs.read(fd)
        finally:
            self.fs.close(fd)

    def translate(self, exc: OSError, name: str, run_id: str) -> Exception:
        """The durably error for a failed open of ``name`` (the caller raises it ``from exc``)."""
        path = self.path(name)
        if exc.errno == errno.ELOOP:
            return UnsafePath(path=path, reason="it is a symlink")
        if exc.errno == errno.EISDIR:
            return UnsafePath(path=path, reason="a directory stands there")
        if exc.errno == errno.ENXIO:  # O_NONBLOCK write-open of a FIFO with no reader
            return UnsafePath(path=path, reason="it is not a regular file (a FIFO or socket)")
        return SaveFailed(run_id=run_id, path=path, reason=os.strerror(exc.errno or 0))

    def remove_temp_files(self, stem: str) -> None:
        """Remove this run's own temp files: exactly ``.<stem>.<16 hex>.tmp``.

        Never another run's: run ``a`` must not touch ``.a.b.<16 hex>.tmp`` (the
        stem is what is left once the fixed-length tail is cut, so it is exact).
        """
        dir_fd = self.fd()
        for name in self.fs.listdir(dir_fd):
            if is_temp_name(name, stem):
                try:
                    self.fs.unlink(name, dir_fd=dir_fd)
                except FileNotFoundError:
                    continue
                logger("durably.store").info("removed %s left by a save that never finished", name)

    def remove_orphaned_temp_files(self) -> None:
        """Remove temp files of runs whose first save never finished (no state file).

        Such a run has no next owner to clean up after it: a creator that was
        killed inside its first save leaves a run ID nobody will open. Its temp
        is removed only while its lock is held here (so a creator still writing
        is left alone) and its state file is still absent.
        """
        dir_fd = self.fd()
        for name in self.fs.listdir(dir_fd):
            if not is_temp_name(name):
                continue
            run_id = name[1:-TEMP_TAIL]
            if RUN_ID_PATTERN.fullmatch(run_id) is None:
                continue
            if self.fs.lstat(run_id + STATE_SUFFIX, dir_fd=dir_fd) is not None:
                continue
            try:
                lock_fd = self.fs.open(
                    run_id + LOCK_SUFFIX, os.O_RDWR | _NOFOLLOW, 0o600, dir_fd=dir_fd
                )
            except OSError:
                continue  # no lock file: nobody can be writing it, but leave it to its owner
            try:
                if self.fs.lock(lock_fd) and (
                    self.fs.lstat(run_id + STATE_SUFFIX, dir_fd=dir_fd) is None
                ):
                    self.remove_temp_files(run_id)
            finally:
                self.fs.close(lock_fd)

    def generations(
        self, stem: str, suffix: str, *, names: Sequence[str] | None = None
    ) -> list[tuple[str, int]]:
        """A run's files ``<stem>.<G><suffix>`` and their generations ``G``.

        Exact names: run ``a``'s are not run ``a.b``'s. ``names`` stand in for
        listing the directory (a lister that has listed it already).
        """
        found = []
        prefix = stem + "."
        for name in self.fs.listdir(self.fd()) if names is None else names:
            if name.startswith(prefix) and name.endswith(suffix):
                middle = name[len(prefix) : -len(suffix)]
                if middle.isdigit():
                    found.append((name, int(middle)))
        return found

    def remove_generations(
        self, stem: str, suffix: str, *, keep: int, missing_ok: bool = False
    ) -> None:
        """Remove a run's files ``<stem>.<G><suffix>`` of every generation but ``keep``."""
        dir_fd = self.fd()
        for name, generation in self.generations(stem, suffix):
            if generation == keep:
                continue
            try:
                self.fs.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                if not missing_ok:
                    raise

    def replace(
        self,
        name: str,
        data: bytes,
        *,
        stem: str,
        on_error: Callable[[OSError, str, bool], Exception],
    ) -> None:
        """Replace ``name`` with ``data`` by the crash-atomic protocol (``replace_file``).

        At any instant the disk holds the old file or the new one. ``on_error``
        turns a failed system call into the exception raised (``True``: the
        directory's fsync failed).
        """
        dir_fd = self.fd()
        self.refuse_symlink(name)
        replace_file(
            self.fs,
            dir_fd,
            name,
            data,
            mode=0o600,
            sync=self.sync,
            point=_save_point,
            on_error=on_error,
            directory=str(self.directory),
            stem=stem,
        )

    # -- cancel requests and prune's tombstones (docs/design.md, "Cancel and prune") ------

    def request_cancel(self, stem: str, run_id: str) -> None:
        """Create ``<stem>.cancel`` (0600) and make it durable: the owner looks for it.

        A request already there is kept: asking twice is asking once.
        """
        name = stem + CANCEL_SUFFIX
        dir_fd = self.fd()
        try:
            fd = open_trusted(
                self.fs, name, os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=dir_fd, path=self.path(name)
            )
        except OSError as exc:
            raise self.translate(exc, name, run_id) from exc
        try:
            if self.sync:
                self.fs.fsync(fd)
                self.fs.fsync(dir_fd)  # the request's name survives a power cut too
        except OSError as exc:
            raise self.translate(exc, name, run_id) from exc
        finally:
            self.fs.close(fd)

    def cancel_requested(self, stem: str) -> bool:
        """Whether ``durably cancel`` asked the owner of ``stem`` to stop (one ``lstat``)."""
        return self.fs.lstat(stem + CANCEL_SUFFIX, dir_fd=self.fd()) is not None

    def remove_cancel_request(self, stem: str) -> None:
        """Remove ``<stem>.cancel`` if it is there (a served or stale request)."""
        dir_fd = self.fd()
        name = stem + CANCEL_SUFFIX
        # lstat first: the common case (no request) changes nothing on disk.
        if self.fs.lstat(name, dir_fd=dir_fd) is not None:
            with suppress(FileNotFoundError):
                self.fs.unlink(name, dir_fd=dir_fd)

    def tombstones(self, names: Sequence[str]) -> list[str]:
        """The run IDs of the tombstones among ``names`` (a directory's listing)."""
        found = []
        for name in names:
            if name.startswith(".") and name.endswith(TOMBSTONE_SUFFIX):
                stem = name[1 : -len(TOMBSTONE_SUFFIX)]
                if RUN_ID_PATTERN.fullmatch(stem) is not None:
                    found.append(stem)
        return sorted(found)

    def bury(self, stem: str) -> None:
        """Prune's commit point: rename ``<stem>.json`` to its tombstone, sync the directory.

        Before the rename the run is whole; after it the run is gone (listing reads
        only non-hidden ``*.json``, open finds no state). The sync comes before any
        of the run's other files is removed: were a power cut to keep those unlinks
        and undo the rename, a state would be left without its log.
        """
        dir_fd = self.fd()
        self.fs.rename(stem + STATE_SUFFIX, tombstone_name(stem), dir_fd=dir_fd)
        faults.point("store.prune.renamed")
        if self.sync:
            self.fs.fsync(dir_fd)
        faults.point("store.prune.dir_synced")

    def finish_tombstone(self, stem: str, *, remove_lock: bool) -> bool:
        """Remove a pruned run's files, then its tombstone; False when it has none.

        The caller holds the run's lock. Logs, temp files and a cancel request go
        first and are synced away, so a run ID used again never meets an old log:
        while any of them is left, the tombstone is too, and whoever takes the lock
        next finishes the job. Then (``remove_lock``: a prune, not a new run of the
        ID) the lock file, and last the tombstone, so that a kill between the two
        still leaves the tombstone that says what to finish. A process that opened
        the old lock file meanwhile finds it gone or replaced before it saves
        (:meth:`Claim.check_usable`), and stops.
        """
        dir_fd = self.fd()
        tombstone = tombstone_name(stem)
        if self.fs.lstat(tombstone, dir_fd=dir_fd) is None:
            return False
        for name, _ in self.generations(stem, ".log"):
            with suppress(FileNotFoundError):
                self.fs.unlink(name, dir_fd=dir_fd)
            faults.point("store.prune.log_removed")
        self.remove_temp_files(stem)
        self.remove_cancel_request(stem)
        if self.sync:
            self.fs.fsync(dir_fd)
        faults.point("store.prune.files_removed")
        if remove_lock:
            with suppress(FileNotFoundError):
                self.fs.unlink(stem + LOCK_SUFFIX, dir_fd=dir_fd)
            faults.point("store.prune.lock_removed")
        with suppress(FileNotFoundError):  # a new run of the ID may be finishing it too
            self.fs.unlink(tombstone, dir_fd=dir_fd)
        faults.point("store.prune.tombstone_removed")
        return True


def tombstone_name(stem: str) -> str:
    """The hidden name a pruned run's state file is renamed to: ``.<stem>.pruned``."""
    return "." + stem + TOMBSTONE_SUFFIX


class Claim:
    """A run held by this process: its locked lock file, and whether it may still save.

    Args:
        directory: the run directory the run is in.
        stem: the run's name stem (its ID, or a thread's key).
        lock_fd: the descriptor of ``<stem>.lock``, flock'ed by this process.
    """

    def __init__(self, directory: RunDirectory, stem: str, lock_fd: int) -> None:
        self.directory = directory
        self.stem = stem
        self.lock_fd: int | None = lock_fd
        self.broken: str | None = None
        """Why the run may not save again (an earlier save failed); None while it may."""
        info = os.fstat(lock_fd)
        self._lock_inode = (info.st_dev, info.st_ino)

    def describe(self) -> str:
        """The path of the run's state file, for messages."""
        return self.directory.path(self.stem + STATE_SUFFIX)

    def release(self) -> None:
        """Close the lock's descriptor, which releases the lock (the file stays)."""
        if self.lock_fd is not None:
            self.directory.fs.close(self.lock_fd)
            self.lock_fd = None

    def check_usable(self) -> None:
        """Refuse to save through a closed or broken claim, or one whose lock was taken away."""
        if self.lock_fd is None:
            raise SaveFailed(run_id=self.stem, path=self.describe(), reason="closed")
        if self.broken is not None:
            raise SaveFailed(
                run_id=self.stem,
                path=self.describe(),
                reason=f"an earlier save failed ({self.broken}); reopen the run",
            )
        self._check_lock_path()

    def _check_lock_path(self) -> None:
        """Stop when the lock file's name no longer leads to the file this claim locked.

        A tmp cleaner (or a person) that deletes or replaces a held lock file lets
        the next opener create a new one and lock it too: two owners. Comparing the
        locked descriptor's inode with the name's before each save costs one
        ``lstat`` and makes this owner stop before writing anything.
        """
        directory = self.directory
        lock_name = self.stem + LOCK_SUFFIX
        try:
            info = directory.fs.lstat(lock_name, dir_fd=directory.fd())
        except OSError:
            info = None
        if info is None or (info.st_dev, info.st_ino) != self._lock_inode:
            self.broken = "the lock file was deleted or replaced while held"
            raise LockLost(run_id=self.stem, path=directory.path(lock_name))

    def failed(self, exc: OSError, name: str, fatal: bool) -> Exception:
        """The exception a failed system call of a save raises (see :meth:`step`)."""
        reason = f"{os.strerror(exc.errno or 0)} on {name}"
        if fatal:
            self.broken = reason
            self.directory.close()
        if exc.errno == errno.ELOOP or isinstance(exc, FileExistsError):
            return UnsafePath(path=self.directory.path(name), reason="something is in the way")
        return SaveFailed(run_id=self.stem, path=self.describe(), reason=reason)

    def step(self, action: Callable[[], _T], name: str, *, fatal: bool = False) -> _T:
        """Run one system call of a save, turning its failure into ``SaveFailed``.

        A failed sync (``fatal``) breaks the claim and drops the directory
        descriptor: the kernel may already have dropped the dirty pages and
        cleared the error, so syncing the same descriptor again and trusting the
        answer would claim durability that does not exist. (A failed fsync of a
        temp file needs no such care: that file is discarded.)
        """
        try:
            return action()
        except OSError as exc:
            raise self.failed(exc, name, fatal) from exc

    def replace(self, name: str, data: bytes) -> None:
        """Replace the run's file ``name`` crash-atomically (see :meth:`RunDirectory.replace`)."""
        self.directory.replace(name, data, stem=self.stem, on_error=self.failed)


def _save_point(step: str) -> None:
    faults.point(f"store.save.{step}")


async def off_the_loop(sync: bool, function: Callable[..., _T], *arguments: object) -> _T:
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
