"""The catalog can fail: each check, on a finished world spoiled the way it guards against.

A check that passes on every world proves nothing. One recorded run of m1 is
finished once (it passes all sixteen); each case copies it, spoils one thing,
and requires the check named for that thing to fail.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from durably import FileStore, PolicyApprover
from durably.state import Phase, RunState
from durably.triage import checks
from durably.triage.agent import build_agent
from durably.triage.checks import CHECKS, run_checks
from durably.triage.runner import TestReport, run_sample_tests
from durably.triage.tools import patches_log
from durably.triage.world import World, load_task, original_sample_dir

TASK = "m1-done-after-delete"
RUN_ID = "checked-run"


@dataclass(frozen=True)
class Finished:
    """A finished world, its store directory and final state."""

    world: World
    store_dir: Path
    state: RunState


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    """The triage demo run to its end once for the module: its world, state and store."""
    root = tmp_path_factory.mktemp("finished")
    world = World.create(root / "world", TASK)
    store = FileStore(root / "runs")
    try:
        agent = build_agent(world=world, store=store, approver=PolicyApprover())
        outcome = asyncio.run(agent.run(load_task(TASK).description, run_id=RUN_ID))
    finally:
        store.close_sync()
    assert outcome.status == "done"
    return Finished(world=world, store_dir=root / "runs", state=outcome.state)


def _sql(world: World, statement: str) -> None:
    with sqlite3.connect(world.tracker_path, isolation_level=None) as connection:
        connection.execute(statement)
    connection.close()


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def _write(path: Path, text: str) -> None:
    path.write_text(text)


def _append_line(path: Path, line: str) -> None:
    with path.open("a") as out:
        out.write(line + "\n")


def _regression_test(world: World) -> Path:
    return world.workspace / load_task(TASK).groups[0].regression_test.path


def _patched_file(world: World) -> Path:
    return world.workspace / load_task(TASK).groups[0].patch.path


def _unpatch(world: World) -> None:
    path = load_task(TASK).groups[0].patch.path
    shutil.copyfile(original_sample_dir() / path, world.workspace / path)


Spoiler = Callable[[World, Path, RunState], RunState | None]
"""Spoils a copy of the finished world; returns a spoiled state, or None to keep it."""

SPOILERS: dict[str, Spoiler] = {
    "run finished with an answer": lambda w, d, s: msgspec.structs.replace(
        s, phase=Phase.MODEL, answer=None
    ),
    "one issue per crash group": lambda w, d, s: _sql(w, "DELETE FROM issues"),
    "no issue filed twice": lambda w, d, s: _sql(
        w,
        "INSERT INTO effects (kind, target, id, key, time) "
        "SELECT kind, target, id, key, time FROM effects WHERE kind = 'issue' LIMIT 1",
    ),
    "issue bodies name their reports": lambda w, d, s: _sql(w, "UPDATE issues SET body = 'x'"),
    "regression tests exist": lambda w, d, s: _regression_test(w).unlink(),
    "regression tests fail on the original code": lambda w, d, s: _write(
        _regression_test(w), "def test_nothing() -> None:\n    pass\n"
    ),
    "all tests pass on the patched code": lambda w, d, s: _unpatch(w),
    "each patch applied exactly once": lambda w, d, s: _edit(
        patches_log(w), "\n", "\n" + patches_log(w).read_text().splitlines()[0] + "\n"
    ),
    "only expected files changed": lambda w, d, s: _write(
        w.workspace / "todo" / "extra.py", "x = 1\n"
    ),
    "comments posted once each": lambda w, d, s: _sql(
        w,
        "INSERT INTO comments (issue, body, key, created) "
        "SELECT issue, body, NULL, created FROM comments LIMIT 1",
    ),
    "workspace matches the recorded hashes": lambda w, d, s: _edit(
        _patched_file(w), "\n", "\n# edited behind the run's back\n"
    ),
    "checkpoint modes 0700/0600": lambda w, d, s: d.chmod(0o755),
    "no leftover temp files": lambda w, d, s: _write(d / f".{RUN_ID}.json.1a2b.tmp", ""),
    "spending equals the saved replies' usage": lambda w, d, s: msgspec.structs.replace(
        s, dollars=s.dollars + 1
    ),
    "no reply paid twice": lambda w, d, s: _append_line(
        w.model_log, json.dumps({"run_id": RUN_ID, "turn": 1})
    ),
    "keys carried on every tracker write": lambda w, d, s: _sql(
        w, "UPDATE requests SET key = NULL WHERE seq = (SELECT min(seq) FROM requests)"
    ),
}


def test_every_check_has_a_spoiler() -> None:
    """Every check has a spoiler that makes it fail."""
    assert sorted(SPOILERS) == sorted(name for name, _ in CHECKS)


def test_the_unspoiled_world_passes_every_check(finished: Finished) -> None:
    """The world an honest run leaves passes every check."""
    verdicts = run_checks(world=finished.world, state=finished.state, store_dir=finished.store_dir)
    assert [v.name for v in verdicts if not v.ok] == []


@pytest.mark.parametrize("name", list(SPOILERS))
def test_each_check_fails_on_the_world_it_guards_against(
    finished: Finished, tmp_path: Path, name: str
) -> None:
    """Each check fails, for the reason it checks, on a world spoiled the way it guards against.

    A check that fails only because it could not run (the spoiler broke the
    scene, not the rule) proves nothing about the rule, so that is not accepted.
    """
    world_root = Path(shutil.copytree(finished.world.root, tmp_path / "world"))
    store_dir = Path(shutil.copytree(finished.store_dir, tmp_path / "runs"))
    world = World.open(world_root)
    returned = SPOILERS[name](world, store_dir, finished.state)
    assert returned is None or isinstance(returned, RunState), f"{name}'s spoiler: {returned!r}"
    spoiled = returned or finished.state
    verdict = {v.name: v for v in run_checks(world=world, state=spoiled, store_dir=store_dir)}
    assert not verdict[name].ok, f"{name} passed a world spoiled for it"
    assert verdict[name].reason
    assert not verdict[name].reason.startswith("could not check"), verdict[name].reason


def test_a_reply_lost_before_its_save_may_be_asked_again_once(
    finished: Finished, tmp_path: Path
) -> None:
    """A repeat the run counted as a reply lost before its save is not paid twice; one more is."""
    world_root = Path(shutil.copytree(finished.world.root, tmp_path / "world"))
    store_dir = Path(shutil.copytree(finished.store_dir, tmp_path / "runs"))
    world = World.open(world_root)
    _append_line(world.model_log, json.dumps({"run_id": RUN_ID, "turn": 3}))
    lost_once = msgspec.structs.replace(finished.state, unsaved_replies=1)

    def verdict(state: RunState) -> str | None:
        by_name = {v.name: v for v in run_checks(world=world, state=state, store_dir=store_dir)}
        return None if by_name["no reply paid twice"].ok else by_name["no reply paid twice"].reason

    assert verdict(lost_once) is None
    _append_line(world.model_log, json.dumps({"run_id": RUN_ID, "turn": 3}))
    assert verdict(lost_once) == (
        "1 model calls asked again for a turn already asked for "
        "(2 repeats, 1 of them for replies lost before their save)"
    )


def test_the_suite_runs_again_for_any_workspace_not_seen_passing(
    finished: Finished, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A passing suite's verdict is reused only for a workspace with the very same files:
    a copy is judged without running it, a copy with one file changed runs it, and fails.
    """
    runs: list[Path] = []
    original = run_sample_tests  # what `checks` calls, until replaced below

    def counted(root: Path, *, only: Sequence[str] | None = None) -> TestReport:
        runs.append(root)
        return original(root, only=only)

    monkeypatch.setattr(checks, "_passing", set())
    monkeypatch.setattr(checks, "run_sample_tests", counted)

    def judge(name: str, spoil: Callable[[World], None] | None = None) -> bool:
        root = Path(shutil.copytree(finished.world.root, tmp_path / name))
        world = World.open(root)
        if spoil is not None:
            spoil(world)
        verdicts = run_checks(world=world, state=finished.state, store_dir=finished.store_dir)
        return {v.name: v.ok for v in verdicts}["all tests pass on the patched code"]

    def suite_runs() -> int:
        return sum(1 for root in runs if root.name == "workspace")

    assert judge("first")
    assert judge("second")  # the same files elsewhere: judged from the first verdict
    assert suite_runs() == 1
    assert not judge("unpatched", _unpatch)
    assert suite_runs() == 2
