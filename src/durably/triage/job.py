"""The triage agent as a sweep job: the sweep's default and its reference table."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import sys
import tempfile
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import ClassVar

from ..approval import Approver, Done, Rerun, ResolveRequest
from ..loop import Agent
from ..models import CallLog
from ..state import RunState
from ..sweep import RUN_ID, digest_files
from ..sweep import World as SweepWorld
from ..sweep.job import DemoOutcome
from ..sweep.tree import Tree
from .agent import build_agent, replay_model
from .checks import run_checks
from .tools import ToolOptions, applied_patches, patches_log
from .world import World, load_task

__all__ = ["NO_REFILE_GUARD", "TriageDemo", "TriageJob", "world_effects"]

NO_REFILE_GUARD = "no refile guard"
"""The job's knob: its tracker files a cause again instead of refusing (a duplicate shows)."""

# The sweep counts re-asked replies itself, telling a lost reply (asked again, as it
# must be) from a saved one paid twice; the check's plain count cannot tell them apart.
_SWEEP_COUNTS_ITSELF = {"no reply paid twice"}


class TriageJob:
    """Sweeps one triage task, in every sweep (a :class:`~durably.sweep.job.CommandJob`).

    The labelled, system-call and power-loss sweeps run its agent in forked
    children; the random sweep runs its command (``durably triage``) as a user
    does, and judges by what the command left.

    Args:
        task: the task's name.
        sync: fsync workspace writes and the tracker's commits, as the triage command
            does (the system-call sweep kills at those fsyncs too); off by default,
            since killing a process loses nothing a sync would have kept.
    """

    knobs: ClassVar[Mapping[str, str]] = MappingProxyType(
        {NO_REFILE_GUARD: "the tracker files a cause again (a duplicate shows)"}
    )
    """The switches of its world a configuration may turn on (``Config.knobs``)."""

    def __init__(self, task: str = "m1-done-after-delete", *, sync: bool = False) -> None:
        self._task = load_task(task)
        self.sync = sync
        self.name = f"triage {task}"
        self._file_digests: dict[tuple[str, int, int, int], str] = {}
        self._readers: dict[tuple[int, str], sqlite3.Connection] = {}
        self._template: Tree | None = None

    def _world(self, world: SweepWorld) -> World:
        return World.at(world.root / "world", self._task.name)

    def prepare(self, world: SweepWorld) -> None:
        """A fresh copy of the sample and an empty tracker.

        The first world is made by ``World.create``; every later one is written
        from an in-memory copy of it (files, modes, the empty tracker's bytes),
        which costs a fraction of copying the sample and creating a database.
        """
        if self._template is None:
            with tempfile.TemporaryDirectory(prefix="durably-template-") as scratch:
                World.create(Path(scratch) / "world", self._task.name)
                self._template = Tree.read(Path(scratch) / "world")
        self._template.write(world.root / "world")

    def task(self) -> str:
        """The task's description, as the recording expects it."""
        return self._task.description

    def agent(self, world: SweepWorld, approver: Approver) -> Agent:
        """The triage agent under the world's configuration."""
        config = world.config
        triage_world = self._world(world)
        agent = build_agent(
            world=triage_world,
            store=world.store(),
            approver=approver,
            model=replay_model(triage_world, fickle=config.fickle),
            options=ToolOptions(
                honour_keys=config.honour_keys,
                refile_guard=NO_REFILE_GUARD not in config.knobs,
            ),
            sync=self.sync,
        )
        agent.tools = {t.name: t for t in config.adapt(list(agent.tools.values()))}
        return agent

    def call_log(self, world: SweepWorld) -> CallLog:
        """The recording's call log."""
        return CallLog(self._world(world).model_log)

    def effects(self, world: SweepWorld) -> Counter[str]:
        """Issues by cause, comments by issue and text, patches by file."""
        return world_effects(self._world(world))

    def oracle(self, world: SweepWorld, request: ResolveRequest) -> Rerun | Done:
        """What a person finds by looking at the tracker and the files."""
        triage_world = self._world(world)
        key = request.idempotency_key
        if request.tool == "file_issue":
            with triage_world.tracker(sync=False) as tracker:
                hits = [i for i in tracker.issues() if i.key == key]
            return Done(json.dumps({"number": hits[0].number})) if hits else Rerun()
        if request.tool == "comment_issue":
            with triage_world.tracker(sync=False) as tracker:
                notes = [c for c in tracker.comments() if c.key == key]
            return Done(json.dumps({"comment": notes[0].id})) if notes else Rerun()
        if request.tool == "code_patch":
            arguments = json.loads(request.arguments)
            current = (triage_world.workspace / arguments["path"]).read_text()
            if arguments["new"] in current:
                return Done(f"patched {arguments['path']} (confirmed by a person)")
            return Rerun()
        return Rerun()

    def checks(self, world: SweepWorld, state: RunState) -> list[str]:
        """The catalog's failures, with reasons."""
        verdicts = run_checks(world=self._world(world), state=state, store_dir=world.store_dir)
        return [
            f"{v.name}: {v.reason}"
            for v in verdicts
            if not v.ok and v.name not in _SWEEP_COUNTS_ITSELF
        ]

    def fingerprint(self, world: SweepWorld) -> str:
        """Everything a crash now would leave: checkpoint, tracker, workspace, logs.

        Called at every crash point, so it reads little: the run's files in the
        store in full (a snapshot, and a journal's log; not its lock, nor temp
        files, which every open removes), the tracker's request count (every
        write it accepts or refuses is a request row, so nothing else in it
        changes without one), the sizes of the append-only logs, and each
        workspace file's digest, re-read only when its inode, size or
        modification time moved (workspace writes rename a new file into place,
        so a changed file always has a new inode).
        """
        triage_world = self._world(world)
        digest = hashlib.sha256(digest_files(_run_files(world.store_dir)).encode())
        digest.update(f"requests {self._request_count(triage_world.tracker_path)}".encode())
        for log in (triage_world.model_log, patches_log(triage_world), world.questions_log):
            digest.update(f"{log.name} {log.stat().st_size if log.exists() else -1}".encode())
        for path, info in _workspace_files(str(triage_world.workspace)):
            stamp = (path, info.st_ino, info.st_size, info.st_mtime_ns)
            known = self._file_digests.get(stamp)
            if known is None:
                with open(path, "rb") as file:
                    known = hashlib.sha256(file.read()).hexdigest()
                self._file_digests[stamp] = known
            digest.update(f"{path} {known}".encode())
        return digest.hexdigest()

    def command(self, state: Path, store: str) -> list[str]:
        """``durably triage`` on the recording, approvals off, the run kept under ``state``."""
        return [
            sys.executable,
            "-m",
            "durably",
            "triage",
            "--task",
            self._task.name,
            "--approve",
            "off",
            "--model",
            "replay",
            "--store",
            store,
            "--state",
            str(state),
        ]

    def outcome(self, state: Path) -> DemoOutcome | None:
        """The checks the command wrote when its run finished, and its world's effects."""
        verdicts = sorted((state / "worlds").glob("*/checks.json"))
        if not verdicts:
            return None  # the command writes them only once its run is done
        checks = json.loads(verdicts[-1].read_text())
        return DemoOutcome(
            checks=tuple((c["name"], bool(c["ok"]), c["reason"]) for c in checks),
            effects=world_effects(World.open(verdicts[-1].parent)),
        )

    def _request_count(self, database: Path) -> int:
        # One read-only connection per process (a connection never crosses a fork).
        key = (os.getpid(), str(database))
        connection = self._readers.get(key)
        if connection is None:
            # Points are hit one at a time, from the loop or a save thread: never at once.
            connection = sqlite3.connect(
                f"file:{database}?mode=ro", uri=True, check_same_thread=False
            )
            self._readers[key] = connection
        (count,) = connection.execute("SELECT coalesce(max(seq), 0) FROM requests").fetchone()
        return int(count)


TriageDemo = TriageJob
"""The name the random sweep's triage job had: one job class now serves every sweep."""


def world_effects(triage_world: World) -> Counter[str]:
    """Every effect the receivers of a world performed.

    Issues by cause, comments by issue and text, patches by file (from the patch ledger).
    """
    with triage_world.tracker(sync=False) as tracker:  # closed: a sweep opens thousands
        causes = {issue.number: issue.cause for issue in tracker.issues()}
        bodies = {comment.id: comment.body for comment in tracker.comments()}
        performed = tracker.effects()
    found: Counter[str] = Counter()
    for effect in performed:
        if effect.kind == "issue":
            found[f"issue {causes.get(effect.target, effect.target)}"] += 1
        else:
            found[f"comment #{effect.target} {bodies.get(effect.id, '')[:40]}"] += 1
    for patch in applied_patches(triage_world):
        found[f"patch {patch['path']}"] += 1
    return found


def _run_files(store_dir: Path) -> list[Path]:
    try:
        names = os.listdir(store_dir)
    except FileNotFoundError:
        return []
    prefix = f"{RUN_ID}."
    return [
        store_dir / name
        for name in sorted(names)
        if name.startswith(prefix) and not name.endswith(".lock")
    ]


def _workspace_files(root: str) -> list[tuple[str, os.stat_result]]:
    found = []
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = sorted(d for d in subdirectories if d != "__pycache__")
        for name in sorted(files):
            if not name.startswith("."):
                path = os.path.join(directory, name)
                found.append((path, os.stat(path)))
    return found


def _counts(path: Path) -> bool:
    return path.is_file() and "__pycache__" not in path.parts and not path.name.startswith(".")
