"""The power-loss sweep: cut the power at crash points of a real run, then resume it on every disk.

:func:`durably.sweep.powerloss.checks.check_protocol` proves that every disk a power cut
may leave loads as the old or the new state. This module closes the loop for a
whole job: the run must then *resume* on that disk and finish correctly.

:func:`run_power_loss_sweep`

1. runs the job once, crash-free, in a forked child, with the run's store
   (synced, as in production) built over a :class:`~durably.sweep.powerloss.model.PowerLossFS`
   rooted at the store directory (the directory itself counts as durable);
2. at every ``every``-th crash point of that run captures, into a scratch
   directory: the legal disk images of the store directory at that instant
   (``fs.images(at=len(fs.log), limit=limit)``), a copy of the rest of the world
   (everything under ``world.root`` except the store directory), and which save
   had last returned and which was in progress;
3. for each distinct (world copy, disk image, saves) capture, in a fresh
   directory: lays out the world copy with the image as the store directory,
   loads the run with a fresh, normal store (it must be the last save that
   returned or the save in progress; ``RunNotFound`` only before the first save
   returned), then resumes the run to completion in forked children, as
   every sweep does (:func:`durably.sweep.engine.restart_and_judge`), and judges it with the
   crash sweep's judge
   (duplicates and losses against the crash-free run's effects, questions,
   replies paid twice, failed checks).

Assumption: only the store is modelled. The rest of the world (the workspace,
the tracker's database, the model's call log, the questions log) is taken to
survive the power cut exactly as it stood at the crash point, as if each of its
writes were synced before it returned (production code does sync them; the
sweep's job runs them unsynced for speed, so the copy is the model). A lost or
torn write there is outside what this sweep tests.

States are compared exactly: each save's state (``saved_at`` aside) is digested
when the save begins, and the loaded state's digest must equal the last
returned save's or the in-progress save's. Equal to an earlier save's is lost
durability; equal to none is a wrong state; an error other than ``RunNotFound``
is an unreadable disk. A violating disk is still resumed and judged: the
table then shows what the lost save costs (duplicates, losses).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec

from ... import faults
from ...errors import RunNotFound
from ...state import RunState
from ...stores.file import FileRun, FileStore
from ...stores.journal import JournalStore
from ..config import Config, check_knobs
from ..engine import restart_and_judge
from ..job import SweepApprover, SweepJob
from ..judge import ScenarioSpec
from ..pool import check_jobs, scenario_workers
from ..process import run_in_child
from ..world import RUN_ID, World
from .checks import Kind, Violation
from .model import PowerLossFS
from .report import PowerLossReport, PowerLossScenario

__all__ = [
    "STORES",
    "PowerLossReport",
    "PowerLossScenario",
    "run_power_loss_sweep",
]

STORES: dict[str, Callable[..., FileStore]] = {
    "snapshot": FileStore,
    "journal": JournalStore,
    "journal-compacting": functools.partial(JournalStore, compact_min_bytes=0, compact_ratio=0.5),
}
"""The stores by name: a store class or factory taking the directory and ``sync``, ``fs``."""


# -- recording: the crash-free run, captured at its crash points ------------------------


def _digest(state: RunState) -> str:
    plain = msgspec.structs.replace(state, saved_at=None)
    return hashlib.sha256(msgspec.json.encode(plain)).hexdigest()


def _summary(state: RunState) -> str:
    return f"turns {state.turns}, {len(state.messages)} messages, {state.phase.value}"


@dataclass
class _Saves:
    """Every save of the recorded run: its state's digest, and whether it has returned."""

    saves: list[dict[str, Any]] = field(default_factory=list)
    returned: int = -1
    running: int | None = None

    def begin(self, state: RunState) -> None:
        self.saves.append({"digest": _digest(state), "summary": _summary(state)})
        self.running = len(self.saves) - 1

    def done(self) -> None:
        if self.running is not None:
            self.returned, self.running = self.running, None


def _tracked(store: FileStore, saves: _Saves) -> FileStore:
    """``store``, its handles recording each save's state as it begins and when it returns."""
    new_handle = store._new_handle  # noqa: SLF001 -- the sweep watches each handle the store makes

    def tracked_handle(run_id: str, lock_fd: int) -> FileRun:
        handle = new_handle(run_id, lock_fd)
        save_sync = handle.save_sync

        def save(state: RunState) -> None:
            saves.begin(state)
            save_sync(state)
            saves.done()

        handle.save_sync = save  # type: ignore[method-assign]
        return handle

    store._new_handle = tracked_handle  # type: ignore[method-assign]  # noqa: SLF001 -- the sweep watches each handle the store makes
    return store


def _image_key(dirs: Sequence[str], files: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for d in dirs:
        digest.update(f"d {d}\0".encode())
    for name, data in sorted(files.items()):
        digest.update(f"f {name} {len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def _record(
    job: SweepJob,
    world: World,
    make_store: Callable[..., FileStore],
    capture: Path,
    *,
    every: int,
    limit: int,
    seed: int,
) -> int:
    """Run the job crash-free in a child, capturing every ``every``-th point into ``capture``."""

    def body() -> None:
        fs = PowerLossFS(world.store_dir)
        saves = _Saves()
        modelled = replace(
            world, store_factory=lambda d: _tracked(make_store(d, sync=True, fs=fs), saves)
        )
        agent = job.agent(modelled, SweepApprover(job, modelled))
        entries: dict[str, dict[str, Any]] = {}
        worlds: list[str] = []
        last_print: list[str] = []
        plan = faults.CrashPlan()
        pairs = [0]
        labels: Counter[str] = Counter()

        def on_point(label: str) -> None:
            fs.mark(label)
            n = len(plan.reached)
            if (n - 1) % every:
                return
            labels[label] += 1
            images = fs.images(at=len(fs.log), seed=seed, limit=limit)
            fingerprint = job.fingerprint(modelled)
            if last_print != [fingerprint]:
                last_print[:] = [fingerprint]
                worlds.append(f"w{len(worlds)}")
                shutil.copytree(
                    world.root,
                    capture / worlds[-1],
                    symlinks=True,
                    ignore=_ignore_store(world.store_dir),
                )
            for image in images:
                pairs[0] += 1
                legal = f"{saves.returned} {saves.running}"
                key = f"{worlds[-1]} {legal} {_image_key(image.dirs, dict(image.files))}"
                if key in entries:
                    entries[key]["covers"] += 1
                    continue
                disk = f"d{len(entries)}"
                image.materialise(capture / disk)
                entries[key] = {
                    "point": n,
                    "label": label,
                    "image": image.description,
                    "world": worlds[-1],
                    "disk": disk,
                    "returned": saves.returned,
                    "running": saves.running,
                    "covers": 1,
                }

        plan.on_point = on_point
        with faults.installed(plan):
            asyncio.run(agent.run(job.task(), run_id=RUN_ID))
        manifest = {
            "points": len(plan.reached),
            "pairs": pairs[0],
            "labels": dict(labels),
            "saves": saves.saves,
            "entries": list(entries.values()),
        }
        (capture / "manifest.json").write_text(json.dumps(manifest))

    return run_in_child(body)


def _ignore_store(store_dir: Path) -> Callable[[str, list[str]], set[str]]:
    def ignore(directory: str, names: list[str]) -> set[str]:
        return {store_dir.name} if Path(directory) == store_dir.parent else set()

    return ignore


# -- resuming on each disk ---------------------------------------------------------------


def _load(
    world: World, saves: Sequence[dict[str, Any]], returned: int, running: int | None
) -> tuple[str, str, Kind | None]:
    """(what loaded, what was expected, the violation's kind or None)."""
    legal = [i for i in (returned, running) if i is not None and i >= 0]
    expected = " or ".join(
        (["RunNotFound"] if returned < 0 else [])
        + [f"save {i + 1} ({saves[i]['summary']})" for i in legal]
    )
    store = world.store()
    try:
        state = store.read_sync(RUN_ID)
    except RunNotFound:
        return "RunNotFound", expected, None if returned < 0 else Kind.LOST
    except Exception as exc:  # noqa: BLE001 - the finding, reported not raised
        message = str(exc).replace(str(world.root), "<world>")
        return f"{type(exc).__name__}: {message}", expected, Kind.UNREADABLE
    finally:
        store.close_sync()
    digest = _digest(state)
    matches = [i for i, s in enumerate(saves) if s["digest"] == digest]
    if not matches:
        return f"a state no save wrote ({_summary(state)})", expected, Kind.WRONG
    if any(i in legal for i in matches):
        chosen = max(i for i in matches if i in legal)
        return f"save {chosen + 1} ({saves[chosen]['summary']})", expected, None
    chosen = max(matches)
    kind = Kind.LOST if chosen < returned else Kind.WRONG
    return f"save {chosen + 1} ({saves[chosen]['summary']})", expected, kind


def _resume(  # noqa: PLR0917 - private, one caller in this module
    job: SweepJob,
    config: Config,
    make_store: Callable[..., FileStore],
    capture: Path,
    saves: Sequence[dict[str, Any]],
    reference: Counter[str],
    entry: dict[str, Any],
) -> PowerLossScenario:
    with tempfile.TemporaryDirectory(prefix="durably-powerloss-resume-") as scratch:
        root = Path(scratch, "world")
        shutil.copytree(capture / entry["world"], root, symlinks=True)
        world = World(root=root, config=config, store_factory=lambda d: make_store(d, sync=False))
        shutil.copytree(capture / entry["disk"], world.store_dir, symlinks=True)
        loaded, expected, kind = _load(world, saves, entry["returned"], entry["running"])
        violation = None
        if kind is not None:
            violation = Violation(
                kind=kind,
                point=entry["point"],
                where=f"at crash point {entry['point']} ({entry['label']})",
                image=entry["image"],
                found=loaded,
                expected=expected,
            )
        spec = ScenarioSpec(config, 1, entry["point"], None, (entry["label"],), entry["covers"])
        result = restart_and_judge(job, world, spec, reference, None, record=False)
        return PowerLossScenario(
            point=entry["point"],
            label=entry["label"],
            image=entry["image"],
            covers=entry["covers"],
            loaded=loaded,
            expected=expected,
            violation=violation,
            result=result,
        )


def run_power_loss_sweep(
    job: SweepJob,
    *,
    config: Config,
    store: str | Callable[..., FileStore] = "journal",
    every: int = 1,
    limit: int = 8,
    seed: int = 0,
    jobs: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> PowerLossReport:
    """Cut the power at crash points of ``job``'s run, then load and resume it on every disk.

    See the module docstring for what is captured, what is assumed and how each
    scenario is judged.

    Args:
        job: what to sweep (its ``agent`` must build its store with ``world.store()``).
        config: the configuration to run under.
        store: a name from :data:`STORES`, or a store factory taking the directory
            and the keywords ``sync`` and ``fs``.
        every: capture every ``every``-th crash point (1, 1+every, ...).
        limit: disk images per point at most (the extremes come first).
        seed: seeds the garbage bytes of the images.
        jobs: worker processes resuming scenarios in parallel.
        progress: called with (scenarios done, scenarios in all).
    """
    if every < 1:
        raise ValueError("every is at least 1")
    check_jobs(jobs)
    check_knobs(job, [config])
    make_store = STORES[store] if isinstance(store, str) else store
    store_name = store if isinstance(store, str) else getattr(store, "__name__", "custom")
    with tempfile.TemporaryDirectory(prefix="durably-powerloss-sweep-") as scratch:
        world = World(root=Path(scratch, "run"), config=config)
        world.root.mkdir()
        job.prepare(world)
        world.store_dir.mkdir(mode=0o700, exist_ok=True)
        capture = Path(scratch, "captures")
        capture.mkdir()
        status = _record(job, world, make_store, capture, every=every, limit=limit, seed=seed)
        manifest_path = capture / "manifest.json"
        if status != 0 or not manifest_path.exists():
            raise RuntimeError(f"{job.name} under {config.name!r} did not finish (status {status})")
        manifest = json.loads(manifest_path.read_text())
        reference = job.effects(world)
        entries: list[dict[str, Any]] = manifest["entries"]
        resume = functools.partial(
            _resume, job, config, make_store, capture, manifest["saves"], reference
        )
        scenarios: list[PowerLossScenario] = []
        with scenario_workers(jobs, job, config, resume) as run_all:
            for scenario in run_all(entries):
                scenarios.append(scenario)
                if progress is not None:
                    progress(len(scenarios), len(entries))
    scenarios.sort(key=lambda s: (s.point, s.image))
    return PowerLossReport(
        job=job.name,
        config=config.name,
        store=store_name,
        points=manifest["points"],
        captured=-(-manifest["points"] // every),
        pairs=manifest["pairs"],
        saves=len(manifest["saves"]),
        captured_labels=manifest["labels"],
        scenarios=tuple(scenarios),
    )
