"""The checks: after every power cut, every legal disk must hold what was promised.

:func:`check_protocol` runs a :class:`~durably.stores.file.FileStore` over a
:class:`~durably.sweep.powerloss.model.PowerLossFS` (create, then ``saves`` more
saves of distinct states) and, at every op-log boundary, loads every image with
a fresh, normal store. Each must load as the last save that returned or the save
in progress; ``RunNotFound`` is legal only until the create returned.
:func:`check_lock_exclusion` forces the race that deleting lock files opens: two
openers holding the run at once.

:func:`check_workspace` does for the workspace what :func:`check_protocol` does
for the store: workspace writes go through the same seam and the same
crash-atomic primitive, so every legal disk after every power cut during a
series of writes (one creating a directory) must hold each file as the last
write that returned or the one in progress, never older, never torn; and the
temp files a cut leaves are exactly the ones the next owner removes.

Each check takes ``mutant=`` (a name from
:data:`~durably.sweep.powerloss.mutants.MUTANTS`) to check a seeded flaw instead
of the real code: the store (or workspace) the check writes with is then the
mutant's (:meth:`~durably.sweep.powerloss.mutants.Mutant.store`); the fresh
stores that load the disks afterwards are always the real ones.

The real protocol is checked by ``test_the_real_protocol_survives_every_power_cut``
and ``test_the_real_store_never_has_two_owners``.
"""

from __future__ import annotations

import enum
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from ... import faults
from ..._sysio import FileSystem
from ...errors import Locked, RunNotFound
from ...state import RunState, UserMessage
from ...stores.file import FileRun, FileStore
from ...workspace import Workspace
from .model import DiskImage, Op, PowerLossFS
from .mutants import mutant as find_mutant

__all__ = [
    "WORKSPACE_FILE",
    "Exploration",
    "Kind",
    "Violation",
    "check_lock_exclusion",
    "check_protocol",
    "check_store",
    "check_workspace",
    "explore",
    "numbered_state",
    "workspace_content",
]


class Kind(enum.StrEnum):
    """What went wrong in a violation."""

    LOST = "lost durability"
    """An older state than the last save that returned, or no run at all after the create."""
    WRONG = "wrong state"
    """A state that no save wrote, or a save that had not started."""
    UNREADABLE = "unreadable"
    """An error other than ``RunNotFound`` (a torn or garbage checkpoint, most often)."""
    TWO_OWNERS = "two owners"
    """Two handles own the run at once."""


@dataclass(frozen=True, kw_only=True)
class Violation:
    """One disk (or one interleaving) where the store broke its promise."""

    kind: Kind
    point: int
    """How many ops of the log had happened at the power cut (-1 for the lock check)."""
    where: str
    """The point in words: the last op and which saves had returned."""
    image: str
    """Which disk image (or interleaving), in words."""
    found: str
    """What loaded, or which error."""
    expected: str

    def __str__(self) -> str:
        return (
            f"{self.kind} {self.where}: on [{self.image}] found {self.found}, "
            f"expected {self.expected}"
        )


@dataclass(frozen=True, kw_only=True)
class Exploration:
    """What :func:`explore` checked and what it found."""

    violations: list[Violation]
    points: int
    """Op-log boundaries judged (creation included)."""
    states: int
    """Distinct durability states among them (each one's images are loaded once)."""
    images: int
    """Disk images materialised and loaded."""
    capped: int
    """States whose images were cut at ``limit`` (the extremes are always kept)."""
    log: list[Op]


@dataclass(frozen=True)
class _Outcome:
    save: int | None
    """The number of the save whose state loaded."""
    found: str
    missing: bool = False


def numbered_state(n: int, *, run_id: str = "r1") -> RunState:
    """State ``n`` of the checks' run: ``n`` messages, so every save's state is distinct."""
    return RunState(
        run_id=run_id,
        task="survive a power cut",
        created_at=datetime(2025, 1, 1, tzinfo=UTC),
        messages=[UserMessage(text=f"message {i}") for i in range(1, n + 1)],
    )


def explore(  # noqa: PLR0913 - the model checker's options, keyword-only with defaults
    *,
    saves: int = 4,
    mutant: str | None = None,
    make_fs: Callable[[Path], PowerLossFS] = PowerLossFS,
    layout: str = "runs",
    seed: int = 0,
    limit: int = 48,
    reorder: bool = True,
    resume: bool = False,
    run_id: str = "r1",
    store: Callable[..., FileStore] = FileStore,
) -> Exploration:
    """Create a run, save it ``saves`` more times, and load every image at every point.

    Args:
        saves: saves after the create; save ``n`` writes state ``n`` (``n`` messages),
            the create being save 1.
        mutant: a name from ``MUTANTS`` (:mod:`.mutants`) to check instead of the real store.
        make_fs: builds the modelled file system over a fresh root directory.
        layout: the state directory, relative to that root (``a/b/runs`` makes
            the store create its parents too).
        seed: seeds the garbage bytes.
        limit: images per point at most.
        reorder: see :meth:`PowerLossFS.images`.
        resume: load each image as a restarted process does (``open_sync``: take
            the lock, remove temp files) rather than with ``read_sync``.
        run_id: the run's ID.
        store: the store class (or factory taking the directory and keywords ``fs``
            and ``sync``) to check: the snapshot store by default, or the journal store.
    """
    writer = store if mutant is None else _mutant_store(mutant, store)
    with tempfile.TemporaryDirectory(prefix="durably-powerloss-") as tmp:
        root = Path(tmp, "disk")
        root.mkdir(mode=0o700)
        scratch = Path(tmp, "images")
        scratch.mkdir(mode=0o700)
        fs = make_fs(root)
        expected = [numbered_state(n, run_id=run_id) for n in range(1, saves + 2)]
        events: list[tuple[int, int, bool]] = []

        def event(save: int, returned: bool) -> None:
            fs.mark(f"save {save} {'returned' if returned else 'begins'}")
            events.append((len(fs.log), save, returned))

        with faults.installed(faults.CrashPlan(on_point=fs.mark)):
            modelled = writer(root / layout, fs=fs)
            try:
                event(1, returned=False)
                handle = modelled.create_sync(msgspec.structs.replace(expected[0]))
                event(1, returned=True)
                for n in range(2, saves + 2):
                    event(n, returned=False)
                    handle.save_sync(msgspec.structs.replace(expected[n - 1]))
                    event(n, returned=True)
                handle.close_sync()
            finally:
                modelled.close_sync()

        violations: list[Violation] = []
        reported: set[tuple[int, str, str, Kind]] = set()
        outcomes: dict[int, list[tuple[str, _Outcome]]] = {}
        version = 0
        loaded = 0
        capped = 0
        for point in range(len(fs.log) + 1):
            if point and fs.log[point - 1].mutates:
                version += 1
            if version not in outcomes:
                images = fs.images(at=point, seed=seed, limit=limit + 1, reorder=reorder)
                if len(images) > limit:
                    capped += 1
                    images = images[:limit]
                outcomes[version] = [
                    (
                        image.description,
                        _load(image, scratch, layout, run_id, expected, resume=resume, store=store),
                    )
                    for image in images
                ]
                loaded += len(images)
            returned = max((s for at, s, r in events if r and at <= point), default=None)
            running = max((s for at, s, r in events if not r and at <= point), default=None)
            if running == returned:
                running = None
            where = _where(fs.log, point, returned, running)
            for description, outcome in outcomes[version]:
                judged = _judge(outcome, returned, running)
                if judged is None:
                    continue
                kind, wanted = judged
                key = (version, description, outcome.found, kind)
                if key not in reported:
                    reported.add(key)
                    violations.append(
                        Violation(
                            kind=kind,
                            point=point,
                            where=where,
                            image=description,
                            found=outcome.found,
                            expected=wanted,
                        )
                    )
        return Exploration(
            violations=violations,
            points=len(fs.log) + 1,
            states=len(outcomes),
            images=loaded,
            capped=capped,
            log=list(fs.log),
        )


def check_protocol(  # noqa: PLR0913 - the model checker's options, keyword-only with defaults
    *,
    saves: int = 4,
    mutant: str | None = None,
    make_fs: Callable[[Path], PowerLossFS] = PowerLossFS,
    layout: str = "runs",
    seed: int = 0,
    limit: int = 48,
    reorder: bool = True,
    resume: bool = False,
    store: Callable[..., FileStore] = FileStore,
) -> list[Violation]:
    """Every power cut during a create and ``saves`` saves, on every legal disk: the violations.

    Each disk must load (with a fresh, normal store) as the last save that returned
    or the save in progress; ``RunNotFound`` only until the create returned. See
    :func:`explore` for the arguments and for the counts.
    """
    return explore(
        saves=saves,
        mutant=mutant,
        make_fs=make_fs,
        layout=layout,
        seed=seed,
        limit=limit,
        reorder=reorder,
        resume=resume,
        store=store,
    ).violations


def check_lock_exclusion(*, mutant: str | None = None, run_id: str = "r1") -> list[Violation]:
    """Force the race that deleting lock files opens; report two owners at once, if any.

    A owns the run. B opens the lock file and, before its ``flock``, A closes the
    run. Then C opens the run. Locks belong to open file descriptions, so three
    stores in one process exclude each other exactly as three processes would.
    With lock files that stay, B owns and C gets ``Locked``. With lock files
    deleted on close, B locks the orphaned inode and C a new one: two owners.

    Args:
        mutant: a name from ``MUTANTS`` (:mod:`.mutants`) to check instead of the real store.
        run_id: the run's ID.
    """
    make_store = FileStore if mutant is None else find_mutant(mutant).store()
    with tempfile.TemporaryDirectory(prefix="durably-lock-") as tmp:
        directory = Path(tmp, "runs")
        first = make_store(directory, sync=False)
        owner_a = first.create_sync(numbered_state(1, run_id=run_id))
        second = make_store(directory, sync=False, fs=_Preempted(before_lock=owner_a.close_sync))
        third = make_store(directory, sync=False)
        owners: list[FileRun] = []
        try:
            owners.append(second.open_sync(run_id)[0])
            with suppress(Locked):
                owners.append(third.open_sync(run_id)[0])
            inodes = [os.fstat(h._lock_fd).st_ino for h in owners if h._lock_fd is not None]  # noqa: SLF001 -- the power-loss model drives the store's own steps
        finally:
            for handle in (owner_a, *owners):
                handle.close_sync()
            for store in (first, second, third):
                store.close_sync()
    if len(owners) < 2:
        return []
    return [
        Violation(
            kind=Kind.TWO_OWNERS,
            point=-1,
            where="B opened the lock file, A closed the run, B locked, then C opened",
            image="three stores on one directory",
            found=f"B and C both own the run, locking inodes {inodes[0]} and {inodes[1]}",
            expected="C gets Locked while B owns the run",
        )
    ]


WORKSPACE_FILE = "src/notes.txt"
"""The file :func:`check_workspace` writes (its first write also creates ``src/``)."""


def workspace_content(n: int) -> bytes:
    """What write ``n`` (from 1) of :func:`check_workspace` puts in the file."""
    return (f"version {n}\n" * (n * 7)).encode()


def check_workspace(
    *, mutant: str | None = None, writes: int = 3, seed: int = 0, limit: int = 48
) -> list[Violation]:
    """Every power cut during ``writes`` workspace writes, on every legal disk: the violations.

    The workspace lives under a :class:`PowerLossFS`. At every op-log boundary
    each legal disk is materialised and the file read: it must be the content
    of the last write that returned or of the write in progress (missing only
    until the first write returned). Then a workspace over that disk removes its
    temp files (as the run's next owner does): none may be left, and the file
    must read the same afterwards.

    Args:
        mutant: a name from ``MUTANTS`` (``workspace-no-fsync``) to check instead.
        writes: how many writes of distinct contents.
        seed: seeds the garbage bytes.
        limit: images per point at most.
    """
    make_workspace = Workspace if mutant is None else find_mutant(mutant).workspace()
    with tempfile.TemporaryDirectory(prefix="durably-powerloss-") as tmp:
        root = Path(tmp, "disk")
        (root / "ws").mkdir(parents=True, mode=0o700)
        scratch = Path(tmp, "images")
        scratch.mkdir(mode=0o700)
        fs = PowerLossFS(root)
        events: list[tuple[int, int, bool]] = []
        workspace = make_workspace(root / "ws", fs=fs)
        for n in range(1, writes + 1):
            fs.mark(f"write {n} begins")
            events.append((len(fs.log), n, False))
            workspace.write(WORKSPACE_FILE, workspace_content(n))
            fs.mark(f"write {n} returned")
            events.append((len(fs.log), n, True))
        contents = {workspace_content(n): n for n in range(1, writes + 1)}
        violations: list[Violation] = []
        seen: set[tuple[str, str]] = set()
        for point in range(len(fs.log) + 1):
            returned = max((n for at, n, r in events if r and at <= point), default=None)
            running = max((n for at, n, r in events if not r and at <= point), default=None)
            if running == returned:
                running = None
            for image in fs.images(at=point, seed=seed, limit=limit):
                found = _workspace_outcome(image, scratch, contents)
                legal = [f"write {n}" for n in (returned, running) if n is not None]
                if returned is None:
                    legal.append("missing")
                if found in legal or (found, image.description) in seen:
                    continue
                seen.add((found, image.description))
                # After a write returned, anything but it (or the next) is lost durability.
                lost = returned is not None and not (
                    found.startswith("write ") and int(found.split()[1]) > returned
                )
                violations.append(
                    Violation(
                        kind=Kind.LOST if lost else Kind.UNREADABLE,
                        point=point,
                        where=_where(fs.log, point, returned, running).replace("save", "write"),
                        image=image.description,
                        found=found,
                        expected=" or ".join(legal),
                    )
                )
        return violations


def _workspace_outcome(image: DiskImage, scratch: Path, contents: Mapping[bytes, int]) -> str:
    """Materialise a disk, read the file, clean the temps as an owner would: what was found."""
    target = Path(tempfile.mkdtemp(dir=scratch))
    try:
        base = image.materialise(target / "disk") / "ws"
        try:
            before = (base / WORKSPACE_FILE).read_bytes()
        except FileNotFoundError:
            before = None
        Workspace(base, sync=False).remove_temp_files()
        left = [p.name for p in base.rglob("*.tmp")]
        if left:
            return f"temp files left after cleanup: {left}"
        after = (base / WORKSPACE_FILE).read_bytes() if before is not None else None
        if before != after:
            return "the file changed when temp files were removed"
    finally:
        shutil.rmtree(target)
    if before is None:
        return "missing"
    if before in contents:
        return f"write {contents[before]}"
    return f"content no write made ({len(before)} bytes)"


def _mutant_store(name: str, store: Callable[..., FileStore]) -> Callable[..., FileStore]:
    """The store with mutant ``name``'s flaw; mutants are flaws of the snapshot store."""
    chosen = find_mutant(name)
    if store is not FileStore:
        raise ValueError(
            f"mutant {name!r} is a flaw of the snapshot store (FileStore): check it without store="
        )
    return chosen.store()


def check_store(*, mutant: str | None = None, saves: int = 4, seed: int = 0) -> list[Violation]:
    """Both checks, :func:`check_protocol` and :func:`check_lock_exclusion`: every violation."""
    return check_protocol(saves=saves, mutant=mutant, seed=seed) + check_lock_exclusion(
        mutant=mutant
    )


class _Preempted(FileSystem):
    """The real file system, running ``before_lock`` once just before the first flock.

    It stands for the scheduler pausing this opener between its ``open`` and its ``flock``.
    """

    def __init__(self, *, before_lock: Callable[[], None]) -> None:
        self._before_lock: Callable[[], None] | None = before_lock

    def lock(self, fd: int) -> bool:
        if self._before_lock is not None:
            action, self._before_lock = self._before_lock, None
            action()
        return super().lock(fd)


def _load(
    image: DiskImage,
    scratch: Path,
    layout: str,
    run_id: str,
    expected: Sequence[RunState],
    *,
    resume: bool,
    store: Callable[..., FileStore] = FileStore,
) -> _Outcome:
    """Materialise an image and read (or open) the run with a fresh, normal store."""
    make_store = store
    target = Path(tempfile.mkdtemp(dir=scratch))
    try:
        image.materialise(target / "disk")
        # sync=False: the read never writes, except to create a missing state
        # directory, and nothing on this scratch copy needs to survive a power cut.
        reader = make_store(target / "disk" / layout, sync=False)
        try:
            if resume:
                handle, state = reader.open_sync(run_id)
                handle.close_sync()
            else:
                state = reader.read_sync(run_id)
        except RunNotFound:
            return _Outcome(None, "RunNotFound", missing=True)
        except Exception as exc:  # noqa: BLE001 - any other error is the finding, reported not raised
            message = str(exc).replace(str(target / "disk"), "<image>")
            return _Outcome(None, f"{type(exc).__name__}: {message}")
        finally:
            reader.close_sync()
    finally:
        shutil.rmtree(target)
    n = len(state.messages)
    if 1 <= n <= len(expected) and msgspec.structs.replace(state, saved_at=None) == expected[n - 1]:
        return _Outcome(n, f"save {n}")
    return _Outcome(None, f"a state no save wrote ({n} messages)")


def _judge(outcome: _Outcome, returned: int | None, running: int | None) -> tuple[Kind, str] | None:
    """None when the outcome is legal, else what is wrong and what was expected."""
    legal = [f"save {s}" for s in (returned, running) if s is not None]
    wanted = " or ".join((["RunNotFound"] if returned is None else []) + legal)
    if outcome.missing:
        return None if returned is None else (Kind.LOST, wanted)
    if outcome.save is None:
        kind = Kind.WRONG if outcome.found.startswith("a state") else Kind.UNREADABLE
        return kind, wanted
    if outcome.save in (returned, running):
        return None
    if returned is not None and outcome.save < returned:
        return Kind.LOST, wanted
    return Kind.WRONG, wanted


def _where(log: Sequence[Op], point: int, returned: int | None, running: int | None) -> str:
    last = f"after op {point} ({log[point - 1]})" if point else "before any op"
    done = f"save {returned} returned" if returned is not None else "no save returned"
    busy = f", save {running} in progress" if running is not None else ""
    return f"{last}, {done}{busy}"
