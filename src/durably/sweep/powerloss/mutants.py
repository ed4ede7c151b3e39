"""Seeded mutants: deliberate flaws of the file store and the workspace the checks must catch.

Each mutant breaks the real code path, never a copy of it: the four save mutants
run the real ``FileRun._write_snapshot`` over a file system with one call
dropped or swapped, the lock mutant wraps the real close and open, the workspace
mutant is the real :class:`~durably.workspace.Workspace` with its ``sync`` seam
off. A mutant lists the methods it replaces (:attr:`Mutant.overrides`); the
checks use it through their store seam, as a :class:`~durably.stores.file.FileStore`
subclass (:meth:`Mutant.store`, whose handles come from the store's
``_new_handle``) or a :class:`~durably.workspace.Workspace` subclass
(:meth:`Mutant.workspace`). Nothing is patched: only the objects a check builds
carry the flaw. (``tests/_helpers/mutants.py`` installs the same overrides
process-wide, in tests, for the mutant catalog.)

What catches each, in ``tests/test_powerloss.py`` (``test_each_seeded_mutant_is_caught``):

==========================  ========================  ==================================
mutant                      caught by                 violation
==========================  ========================  ==================================
no-file-fsync               check_protocol            unreadable: the renamed file's data
                                                      lost after the save returned
                                                      (``CheckpointCorrupt``, empty)
no-dir-fsync                check_protocol            lost durability: the rename undone
                                                      after the save returned
write-in-place              check_protocol            unreadable: the state file truncated
                                                      or torn mid-save
unlink-then-rename          check_protocol            lost durability: ``RunNotFound``
                                                      between the unlink and the rename
no-new-dir-sync             check_protocol            lost durability: the state directory
                                                      itself undone after the create
lock-deleted-on-release     check_lock_exclusion      two owners: the old lock inode and a
                                                      new one are both locked
workspace-no-fsync          check_workspace           lost durability: a workspace file
                                                      empty after its write returned
==========================  ========================  ==================================
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from ..._sysio import FileSystem
from ...state import RunState
from ...stores.file import FileRun, FileStore
from ...workspace import Workspace

__all__ = ["MUTANTS", "Mutant", "mutant"]

_T = TypeVar("_T")


@dataclass(frozen=True, kw_only=True)
class Mutant:
    """A deliberately broken variant of the store, and the check that must catch it."""

    name: str
    flaw: str
    caught_by: str
    """``check_protocol``, ``check_lock_exclusion`` or ``check_workspace``."""
    overrides: tuple[tuple[type, str, Callable[..., Any]], ...]
    """The methods the flaw replaces, as (``FileStore``, ``FileRun`` or ``Workspace``,
    method name, replacement); each replacement calls the real method it wraps."""

    def store(self) -> type[FileStore]:
        """The snapshot store with this flaw (``FileStore`` itself when it has none there).

        Its handles are a ``FileRun`` subclass with the flaw's ``FileRun`` overrides.
        """
        handle = _subclass(FileRun, self._methods(FileRun), self.name)
        methods = self._methods(FileStore)
        if handle is not FileRun:

            def new_handle(store: FileStore, run_id: str, lock_fd: int) -> FileRun:
                return handle(store, run_id, lock_fd)

            methods["_new_handle"] = new_handle
        return _subclass(FileStore, methods, self.name)

    def workspace(self) -> type[Workspace]:
        """The workspace with this flaw (``Workspace`` itself when it has none there)."""
        return _subclass(Workspace, self._methods(Workspace), self.name)

    def _methods(self, owner: type) -> dict[str, Callable[..., Any]]:
        return {name: function for cls, name, function in self.overrides if cls is owner}


def _subclass(base: type[_T], methods: dict[str, Callable[..., Any]], name: str) -> type[_T]:
    """``base`` with ``methods`` in place of its own, named after the mutant."""
    if not methods:
        return base
    title = "".join(part.title() for part in name.split("-"))
    return cast("type[_T]", type(f"{base.__name__}{title}", (base,), dict(methods)))


class _FlawedFS:
    """The store's file system as one save of the snapshot protocol sees it, one step broken.

    Every call goes to the real file system except the one the flaw changes,
    so the mutant runs the store's real save (:meth:`FileRun._write_snapshot`)
    with a single system call dropped or swapped.
    """

    def __init__(self, real: FileSystem, mutation: str, *, dir_fd: int, name: str) -> None:
        self._real, self._mutation, self._dir_fd, self._name = real, mutation, dir_fd, name

    def __getattr__(self, attribute: str) -> object:
        return getattr(self._real, attribute)

    def open(self, name: str, flags: int, mode: int, *, dir_fd: int) -> int:
        if self._mutation == "write-in-place" and name.endswith(".tmp"):
            # The state file itself, truncated, instead of a new temp file.
            name, flags = self._name, (flags & ~os.O_EXCL) | os.O_TRUNC
        return self._real.open(name, flags, mode, dir_fd=dir_fd)

    def fsync(self, fd: int) -> None:
        if self._mutation == "no-dir-fsync" and fd == self._dir_fd:
            return
        if self._mutation == "no-file-fsync" and fd != self._dir_fd:
            return
        self._real.fsync(fd)

    def rename(self, src: str, dst: str, *, dir_fd: int) -> None:
        if self._mutation == "write-in-place":
            return  # the data is already in place
        if self._mutation == "unlink-then-rename" and self._real.lstat(dst, dir_fd=dir_fd):
            self._real.unlink(dst, dir_fd=dir_fd)
        self._real.rename(src, dst, dir_fd=dir_fd)


_real_write_snapshot = FileRun._write_snapshot  # noqa: SLF001 -- the power-loss model drives the store's own steps


def _flawed_write(mutation: str) -> Callable[[FileRun, bytes], None]:
    """``FileRun._write_snapshot``, the real one, run over a :class:`_FlawedFS`."""

    def write_snapshot(self: FileRun, data: bytes) -> None:
        store = self._store
        real = store.fs
        name = self.run_id + ".json"
        store.fs = _FlawedFS(real, mutation, dir_fd=store._directory_fd(), name=name)  # type: ignore[assignment]  # noqa: SLF001 -- the power-loss model drives the store's own steps
        try:
            _real_write_snapshot(self, data)
        finally:
            store.fs = real

    return write_snapshot


def _make_directory_unsynced(self: FileStore) -> None:
    """``FileStore._make_directory`` without syncing the new directory into its parent."""
    self.directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        self.fs.mkdir(str(self.directory), 0o700)
    except FileExistsError:
        return


_real_close_sync = FileRun.close_sync


def _close_deleting_lock(self: FileRun) -> None:
    """``FileRun.close_sync`` that deletes the lock file before the real close releases it."""
    if self._lock_fd is not None:
        store = self._store
        # Another handle may have deleted it already: the flaw is that nothing
        # ties the name to the inode this handle locked.
        with suppress(FileNotFoundError):
            store.fs.unlink(self.run_id + ".lock", dir_fd=store._directory_fd())  # noqa: SLF001 -- the power-loss model drives the store's own steps
    _real_close_sync(self)


_real_open_sync = FileStore.open_sync


def _open_recreating_lock(self: FileStore, run_id: str) -> tuple[FileRun, RunState]:
    """``FileStore.open_sync`` that makes the lock file again when it is gone.

    A store that deletes lock files must, or no run could be reopened after a clean close.
    """
    dir_fd = self._directory_fd()
    lock = run_id + ".lock"
    if self.fs.lstat(run_id + ".json", dir_fd=dir_fd) and not self.fs.lstat(lock, dir_fd=dir_fd):
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        self.fs.close(self.fs.open(lock, flags, 0o600, dir_fd=dir_fd))
    return _real_open_sync(self, run_id)


_real_workspace_init = Workspace.__init__


def _workspace_init_unsynced(self: Workspace, root: str | os.PathLike[str], **options: Any) -> None:
    """The real ``Workspace`` with its sync seam turned off: no file or directory is fsynced."""
    _real_workspace_init(self, root, **{**options, "sync": False})


def _save_mutant(name: str, flaw: str) -> Mutant:
    patch = (FileRun, "_write_snapshot", _flawed_write(name))
    return Mutant(name=name, flaw=flaw, caught_by="check_protocol", overrides=(patch,))


MUTANTS: dict[str, Mutant] = {
    mutant.name: mutant
    for mutant in (
        _save_mutant("no-file-fsync", "the temp file is renamed into place without an fsync"),
        _save_mutant("no-dir-fsync", "the directory is not synced after the rename"),
        _save_mutant("write-in-place", "the state file is truncated and rewritten in place"),
        _save_mutant("unlink-then-rename", "the old state file is unlinked before the rename"),
        Mutant(
            name="no-new-dir-sync",
            flaw="a new state directory is not synced into its parent",
            caught_by="check_protocol",
            overrides=((FileStore, "_make_directory", _make_directory_unsynced),),
        ),
        Mutant(
            name="workspace-no-fsync",
            flaw="the workspace's real write with its sync seam off: renamed into place unsynced",
            caught_by="check_workspace",
            overrides=((Workspace, "__init__", _workspace_init_unsynced),),
        ),
        Mutant(
            name="lock-deleted-on-release",
            flaw="the lock file is unlinked on close (and made again by the next open)",
            caught_by="check_lock_exclusion",
            overrides=(
                (FileRun, "close_sync", _close_deleting_lock),
                (FileStore, "open_sync", _open_recreating_lock),
            ),
        ),
    )
}
"""The seeded mutants of the save protocol, by name."""


def mutant(name: str) -> Mutant:
    """The mutant called ``name``.

    Raises:
        ValueError: there is no such mutant (the message names the ones there are).
    """
    try:
        return MUTANTS[name]
    except KeyError as exc:
        raise ValueError(f"unknown mutant {name!r}; choose from {sorted(MUTANTS)}") from exc
