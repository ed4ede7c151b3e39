"""The triage agent as a sweep job: the sweep's default and its reference table."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from ..approval import Approver, Done, Rerun, ResolveRequest
from ..loop import Agent
from ..models import CallLog
from ..state import RunState
from ..sweep.core import World as SweepWorld
from ..sweep.core import digest_files
from .agent import build_agent, replay_model
from .checks import run_checks
from .tools import ToolOptions, applied_patches, patches_log
from .world import World, load_task

__all__ = ["TriageJob"]

# The sweep counts re-asked replies itself, telling a lost reply (asked again, as it
# must be) from a saved one paid twice; the check's plain count cannot tell them apart.
_SWEEP_COUNTS_ITSELF = {"no reply paid twice"}


class TriageJob:
    """Sweeps one triage task.

    Args:
        task: the task's name.
    """

    def __init__(self, task: str = "m1-done-after-delete") -> None:
        self._task = load_task(task)
        self.name = f"triage {task}"

    def _world(self, world: SweepWorld) -> World:
        return World.at(world.root / "world", self._task.name)

    def prepare(self, world: SweepWorld) -> None:
        """A fresh copy of the sample and an empty tracker."""
        World.create(world.root / "world", self._task.name)

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
            options=ToolOptions(honour_keys=config.honour_keys),
            sync=False,
        )
        agent.tools = {t.name: t for t in config.adapt(list(agent.tools.values()))}
        return agent

    def call_log(self, world: SweepWorld) -> CallLog:
        """The recording's call log."""
        return CallLog(self._world(world).model_log)

    def effects(self, world: SweepWorld) -> Counter[str]:
        """Issues by cause, comments by issue and text, patches by file."""
        triage_world = self._world(world)
        tracker = triage_world.tracker(sync=False)
        causes = {issue.number: issue.cause for issue in tracker.issues()}
        bodies = {comment.id: comment.body for comment in tracker.comments()}
        found: Counter[str] = Counter()
        for effect in tracker.effects():
            if effect.kind == "issue":
                found[f"issue {causes.get(effect.target, effect.target)}"] += 1
            else:
                found[f"comment #{effect.target} {bodies.get(effect.id, '')[:40]}"] += 1
        for patch in applied_patches(triage_world):
            found[f"patch {patch['path']}"] += 1
        return found

    def oracle(self, world: SweepWorld, request: ResolveRequest) -> Rerun | Done:
        """What a person finds by looking at the tracker and the files."""
        triage_world = self._world(world)
        tracker = triage_world.tracker(sync=False)
        key = request.idempotency_key
        if request.tool == "file_issue":
            hits = [i for i in tracker.issues() if i.key == key]
            return Done(json.dumps({"number": hits[0].number})) if hits else Rerun()
        if request.tool == "comment_issue":
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
        """Everything a crash now would leave: checkpoint, tracker, workspace, logs."""
        triage_world = self._world(world)
        tracker = triage_world.tracker_path
        files = [
            world.store_dir / "sweep-run.json",
            tracker,
            tracker.with_name(tracker.name + "-wal"),
            triage_world.model_log,
            patches_log(triage_world),
            world.questions_log,
            *sorted(p for p in triage_world.workspace.rglob("*") if _counts(p)),
        ]
        return digest_files(files)


def _counts(path: Path) -> bool:
    return path.is_file() and "__pycache__" not in path.parts and not path.name.startswith(".")
