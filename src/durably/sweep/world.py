"""One scenario's world: its directory, its store, and where a sweep keeps worlds."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..state import RunState
from ..stores.file import FileStore
from .config import Config

__all__ = ["RUN_ID", "StoreFactory", "World", "digest_files", "scratch_root"]

StoreFactory = Callable[[Path], FileStore]
"""Builds a scenario's store over its directory."""

RUN_ID = "sweep-run"


def scratch_root() -> str | None:
    """Where scenario worlds live: ``/dev/shm`` when writable, else the system's temp directory.

    A RAM-backed file system keeps the sweep's many small writes, renames and
    removals off the disk (on ext4 a rename over a file starts its write-back),
    and a killed process leaves the same files there as anywhere else.
    """
    shm = Path("/dev/shm")  # noqa: S108 - each scenario makes its own private directory in it
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


@dataclass(frozen=True, kw_only=True)
class World:
    """One scenario's directory, as the job sees it."""

    root: Path
    config: Config
    store_factory: StoreFactory | None = None
    """Builds the scenario's store over :attr:`store_dir` (default: an unsynced FileStore).
    The power-loss sweep supplies a synced store over a modelled file system here."""

    @property
    def store_dir(self) -> Path:
        """Where the run's checkpoints live."""
        return self.root / "runs"

    @property
    def questions_log(self) -> Path:
        """One line per question asked of a person."""
        return self.root / "questions.jsonl"

    def store(self) -> FileStore:
        """The scenario's store. Syncs are off: the sweep kills processes, not the power.

        The caller closes it (it holds the directory's descriptor); to read once,
        use :meth:`read`.
        """
        if self.store_factory is not None:
            return self.store_factory(self.store_dir)
        return FileStore(self.store_dir, sync=False)

    def read(self) -> RunState:
        """The run's saved state, read through a store that is closed again."""
        store = self.store()
        try:
            return store.read_sync(RUN_ID)
        finally:
            store.close_sync()

    def has_run(self) -> bool:
        """Whether the run was created (its start save returned)."""
        store = self.store()
        try:
            return RUN_ID in store.list_runs_sync()
        finally:
            store.close_sync()


def digest_files(paths: Sequence[Path]) -> str:
    """A digest of files' contents (missing files count as empty), for fingerprints."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(str(path).encode())
        try:
            digest.update(path.read_bytes())
        except FileNotFoundError:
            digest.update(b"\0missing")
    return digest.hexdigest()
