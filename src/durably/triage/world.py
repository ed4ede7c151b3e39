"""The triage agent's world: its tasks, and the directory one run acts on.

A task (:func:`load_task`) is a batch of crash reports against the bundled
sample, with its ground truth: which reports share a root cause, a patch that
fixes each cause, and a regression test that fails before the patch and passes
after it. The checks catalog judges a finished run against that truth.

A world (:class:`World`) is one run's surroundings under a directory::

    <root>/world.json          which task; written last, so it marks a complete world
    <root>/workspace/          a fresh copy of the sample: todo/ and tests/
    <root>/tracker.db          the issue tracker's SQLite database
    <root>/model_calls.jsonl   the model's calls, written by the model adapter

The world lives outside the run's checkpoint on purpose: it is what the run
changes, and what a crash sweep inspects afterwards.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path

import msgspec

from .._sysio import write_file
from ..errors import FieldsPickle
from ..stores._guard import make_private_directories
from .tracker import DEFAULT_KEY_TTL, Clock, Tracker

__all__ = [
    "TASKS",
    "Group",
    "Patch",
    "RegressionTest",
    "Report",
    "Task",
    "UnknownTask",
    "World",
    "WorldError",
    "load_task",
    "original_sample_dir",
]

TASKS: tuple[str, ...] = ("m1-done-after-delete", "m2-due-date-zulu", "m3-unicode-export")
"""The bundled tasks, easiest first."""

_WORLD_FORMAT = 1
_FILE_MODE = 0o644
_DIR_MODE = 0o755
_PRIVATE_FILE = 0o600
"""Files holding what the services received or the conversation: tracker.db, recording.json."""
_PRIVATE_DIR = 0o700
"""The world's own directory (and ``worlds/``): no other user reads into it."""


class WorldError(FieldsPickle, Exception):
    """Raised when a world or a task cannot be set up as asked; the message says why."""


def _why(exc: BaseException) -> str:
    """What the disk said, in a few words: the first failure a tree copy collected."""
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list):
        return str(exc.args[0][0][2])
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return str(exc)


class UnknownTask(WorldError, LookupError):
    """Raised for a task name that is not bundled; the message lists the known ones."""

    def __init__(self, *, name: str) -> None:
        super().__init__(f"unknown triage task {name!r}; known tasks: {', '.join(TASKS)}")
        self.name = name


# -- tasks -----------------------------------------------------------------------


class Report(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One crash report, as a user's client sent it."""

    id: str
    """E.g. ``CR-1042``."""
    timestamp: str
    """When it crashed, ISO 8601 UTC."""
    input: tuple[str, ...]
    """The commands the user ran (``todo.app`` syntax), the last one crashing."""
    traceback: str
    version: str
    """The version of todo that crashed."""


class Patch(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A fix as one exact text replacement: ``old`` occurs exactly once in ``path``."""

    path: str
    """Relative to the workspace, e.g. ``todo/store.py``."""
    old: str
    new: str


class RegressionTest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A test file that fails on the original code and passes once the patch is applied."""

    path: str
    """Relative to the workspace, e.g. ``tests/test_regression_done_after_delete.py``."""
    content: str


class Group(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The reports that share one root cause, and the reference fix for it."""

    cause: str
    """A stable slug, e.g. ``done-after-delete``."""
    reports: tuple[str, ...]
    patch: Patch
    regression_test: RegressionTest


class _Expected(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    task: str
    description: str
    groups: tuple[Group, ...]


class Task(msgspec.Struct, frozen=True, kw_only=True):
    """A batch of crash reports and the truth about them.

    ``msgspec.to_builtins(task.reports)`` gives the reports as plain dicts.
    """

    name: str
    description: str
    """The task in one line, as the model is given it."""
    reports: tuple[Report, ...]
    groups: tuple[Group, ...]

    def report(self, report_id: str) -> Report:
        """The report with this ID.

        Raises:
            KeyError: the batch has no such report.
        """
        for report in self.reports:
            if report.id == report_id:
                return report
        raise KeyError(report_id)

    def group_of(self, report_id: str) -> Group:
        """The group the report belongs to.

        Raises:
            KeyError: no group holds the report.
        """
        for group in self.groups:
            if report_id in group.reports:
                return group
        raise KeyError(report_id)


def load_task(name: str) -> Task:
    """Load a bundled task by name.

    Args:
        name: one of :data:`TASKS`.

    Raises:
        UnknownTask: no task has this name.
        WorldError: the task's files contradict each other.
    """
    if name not in TASKS:
        raise UnknownTask(name=name)
    directory = resources.files("durably.triage").joinpath("tasks", name)
    try:
        reports_bytes = directory.joinpath("reports.json").read_bytes()
        expected_bytes = directory.joinpath("expected.json").read_bytes()
    except OSError as exc:
        raise WorldError(f"task {name!r} cannot be loaded: {exc}") from exc
    # A run builds its agent, and the checks judge it, in every process the sweep
    # starts: the files are read each time, their decoding and checking done once.
    return _decoded_task(name, reports_bytes, expected_bytes)


@functools.lru_cache(maxsize=16)
def _decoded_task(name: str, reports_bytes: bytes, expected_bytes: bytes) -> Task:
    try:
        reports = msgspec.json.decode(reports_bytes, type=tuple[Report, ...])
        expected = msgspec.json.decode(expected_bytes, type=_Expected)
    except msgspec.DecodeError as exc:
        raise WorldError(f"task {name!r} cannot be loaded: {exc}") from exc
    task = Task(
        name=name, description=expected.description, reports=reports, groups=expected.groups
    )
    _check_task(task, expected_name=expected.task)
    return task


def _check_task(task: Task, *, expected_name: str) -> None:
    """Refuse a task whose ground truth does not cover its reports exactly once."""
    if expected_name != task.name:
        raise WorldError(f"task {task.name!r}: expected.json names task {expected_name!r}")
    ids = [report.id for report in task.reports]
    grouped = [report_id for group in task.groups for report_id in group.reports]
    if len(set(ids)) != len(ids) or sorted(grouped) != sorted(ids):
        raise WorldError(
            f"task {task.name!r}: every report must be in exactly one group "
            f"(reports {sorted(ids)}, grouped {sorted(grouped)})"
        )
    causes = [group.cause for group in task.groups]
    if len(set(causes)) != len(causes):
        raise WorldError(f"task {task.name!r}: two groups share a cause ({causes})")


def original_sample_dir() -> Path:
    """The pristine sample shipped with durably: ``todo/`` and ``tests/``. Never write into it.

    Raises:
        WorldError: durably is installed in a form (a zip) whose data is not a directory.
    """
    sample = Path(str(resources.files("durably.triage").joinpath("sample")))
    if not (sample / "todo" / "__init__.py").is_file():
        raise WorldError(f"the bundled sample is not a directory on disk: {sample}")
    return sample


# -- worlds ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class World:
    """One run's world under a directory: the workspace, the tracker, the model log."""

    root: Path
    task: str
    """The name of the task the world was made for."""
    workspace: Path
    """The copy of the sample the run reads, tests and patches."""
    tracker_path: Path
    model_log: Path
    """Where the model adapter appends one JSON line per model call."""

    @classmethod
    def at(cls, root: str | os.PathLike[str], task: str) -> World:
        """The paths of a world under ``root``, whether or not it exists yet."""
        base = Path(root).absolute()
        return cls(
            root=base,
            task=task,
            workspace=base / "workspace",
            tracker_path=base / "tracker.db",
            model_log=base / "model_calls.jsonl",
        )

    @classmethod
    def create(cls, root: str | os.PathLike[str], task: str) -> World:
        """Make a fresh world for ``task`` under ``root`` (created if missing).

        The sample is copied into ``root/workspace`` (files 0644, directories
        0755), the tracker's database is created, and ``world.json`` is written
        last: a directory without it holds no world, whatever else it holds.

        Args:
            root: the world's directory; it must not hold a world already.
            task: one of :data:`TASKS`.

        Raises:
            UnknownTask: no task has this name.
            WorldError: ``root`` already holds a world, or a workspace; or the
                disk refused the world (full, read-only, no permission): what
                this call made is removed again.
        """
        if task not in TASKS:
            raise UnknownTask(name=task)
        world = cls.at(root, task)
        marker = world.root / "world.json"
        if marker.exists():
            raise WorldError(f"{world.root} already holds a world; open it with World.open")
        if world.workspace.exists() or world.tracker_path.exists():
            raise WorldError(
                f"{world.root} holds an unfinished world; remove it or call World.ensure"
            )
        made_root = not world.root.exists()
        try:
            world._lay_out(task, marker)  # noqa: SLF001 -- the class's own constructor
        except (OSError, sqlite3.Error) as exc:
            if made_root:
                shutil.rmtree(world.root, ignore_errors=True)
            raise WorldError(
                f"the world {world.root} could not be made ({_why(exc)}); "
                "free disk space or fix permissions, then try again"
            ) from exc
        return world

    def _lay_out(self, task: str, marker: Path) -> None:
        make_private_directories(self.root)  # 0700 whatever the umask (issue 22)
        # Copy beside the final name, then rename: a crash never leaves a
        # half-copied directory under the name a run would use.
        staging = self.root / f".workspace-{secrets.token_hex(4)}"
        shutil.copytree(
            original_sample_dir(),
            staging,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".mypy_cache"),
        )
        _set_modes(staging)
        staging.rename(self.workspace)
        # Created 0600 before SQLite opens it: its -wal and -shm take the same mode.
        os.close(
            os.open(self.tracker_path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, _PRIVATE_FILE)
        )
        os.chmod(self.tracker_path, _PRIVATE_FILE, follow_symlinks=False)
        Tracker(self.tracker_path)
        record = {"format": _WORLD_FORMAT, "task": task, "created": datetime.now(UTC).isoformat()}
        write_file(marker, (json.dumps(record, indent=2) + "\n").encode(), mode=_FILE_MODE)

    @classmethod
    def open(cls, root: str | os.PathLike[str]) -> World:
        """The world already made under ``root``.

        Raises:
            WorldError: there is no (complete) world there.
        """
        marker = Path(root).absolute() / "world.json"
        try:
            record = json.loads(marker.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise WorldError(
                f"{marker.parent} holds no world (no world.json); make one with World.create"
            ) from exc
        except (OSError, ValueError) as exc:
            raise WorldError(f"{marker} cannot be read: {exc}") from exc
        if not isinstance(record, dict) or record.get("format") != _WORLD_FORMAT:
            raise WorldError(f"{marker} is not a world record of format {_WORLD_FORMAT}")
        return cls.at(marker.parent, str(record["task"]))

    @classmethod
    def ensure(cls, root: str | os.PathLike[str], task: str) -> World:
        """Open the world under ``root``, or create it if there is none.

        What a command that is run again after a crash wants: the first run makes
        the world, every later one finds it. Leftovers of a creation that was
        interrupted (no ``world.json`` yet) are removed and the world made afresh;
        no run can have used them, since a run starts only once this returns.

        Raises:
            UnknownTask: no task has this name.
            WorldError: ``root`` holds a world made for another task.
        """
        world = cls.at(root, task)
        if (world.root / "world.json").exists():
            found = cls.open(root)
            if found.task != task:
                raise WorldError(
                    f"{world.root} holds a world for task {found.task!r}, not {task!r}"
                )
            return found
        if task not in TASKS:
            raise UnknownTask(name=task)
        if world.workspace.exists():
            shutil.rmtree(world.workspace)
        for leftover in (world.tracker_path, *_sqlite_companions(world.tracker_path)):
            leftover.unlink(missing_ok=True)
        return cls.create(root, task)

    def load_task(self) -> Task:
        """The task this world was made for."""
        return load_task(self.task)

    def tracker(
        self,
        *,
        honour_keys: bool = True,
        key_ttl: timedelta = DEFAULT_KEY_TTL,
        clock: Clock | None = None,
        sync: bool = True,
        refile_guard: bool = True,
    ) -> Tracker:
        """A client of this world's tracker, configured as given."""
        return Tracker(
            self.tracker_path,
            honour_keys=honour_keys,
            key_ttl=key_ttl,
            clock=clock,
            sync=sync,
            refile_guard=refile_guard,
        )


def _set_modes(top: Path) -> None:
    top.chmod(_DIR_MODE)
    for directory, subdirectories, files in os.walk(top):
        for name in subdirectories:
            Path(directory, name).chmod(_DIR_MODE)
        for name in files:
            Path(directory, name).chmod(_FILE_MODE)


def _sqlite_companions(database: Path) -> list[Path]:
    return [database.with_name(database.name + suffix) for suffix in ("-wal", "-shm", "-journal")]
