"""The catalog: sixteen checks that judge a finished triage run's world.

Each check has a name and, when it fails, one line saying why. They look at
what the run left behind (the tracker, the workspace, the checkpoint, the model
log), never at what the run says about itself, so a crash sweep can use them
to judge every scenario.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import stat
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..keys import idempotency_key
from ..models import CallLog
from ..state import AssistantMessage, Phase, RunState, Usage
from ..workspace import sha256_bytes
from .runner import run_sample_tests
from .tools import applied_patches
from .tracker import Tracker, normalize_cause
from .world import Task, World, original_sample_dir

__all__ = ["CHECKS", "Check", "run_checks"]


@dataclass(frozen=True, kw_only=True)
class Check:
    """One check's verdict."""

    name: str
    ok: bool
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class _Scene:
    world: World
    task: Task
    tracker: Tracker
    state: RunState
    store_dir: Path


_Result = str | None  # None when the check passes, else the reason it fails


def _finished(s: _Scene) -> _Result:
    if s.state.phase is not Phase.DONE or not s.state.answer:
        return f"the run is {s.state.phase}, not done with an answer"
    return None


def _one_issue_per_group(s: _Scene) -> _Result:
    causes = Counter(issue.cause for issue in s.tracker.issues())
    wrong = [
        f"{g.cause}: {causes.get(normalize_cause(g.cause), 0)}"
        for g in s.task.groups
        if causes.get(normalize_cause(g.cause), 0) != 1
    ]
    return f"issues per cause should be 1 ({', '.join(wrong)})" if wrong else None


def _no_duplicate_issues(s: _Scene) -> _Result:
    filed = [e for e in s.tracker.effects() if e.kind == "issue"]
    if len(filed) != len(s.task.groups):
        return f"{len(filed)} issues filed for {len(s.task.groups)} causes"
    return None


def _bodies_name_reports(s: _Scene) -> _Result:
    by_cause = {issue.cause: issue for issue in s.tracker.issues()}
    missing = []
    for group in s.task.groups:
        issue = by_cause.get(normalize_cause(group.cause))
        if issue is None:
            continue
        missing += [f"#{issue.number} lacks {r}" for r in group.reports if r not in issue.body]
    return "; ".join(missing) if missing else None


def _tests_exist(s: _Scene) -> _Result:
    missing = [
        g.regression_test.path
        for g in s.task.groups
        if not (s.world.workspace / g.regression_test.path).is_file()
    ]
    return f"missing: {', '.join(missing)}" if missing else None


def _tests_fail_on_original(s: _Scene) -> _Result:
    passing = []
    for group in s.task.groups:
        written = s.world.workspace / group.regression_test.path
        if written.is_file() and _passes_on_original(
            group.regression_test.path, written.read_bytes()
        ):
            passing.append(group.regression_test.path)
    return f"pass on the unpatched code: {', '.join(passing)}" if passing else None


@functools.lru_cache(maxsize=64)
def _passes_on_original(path: str, test: bytes) -> bool:
    """Whether the test file ``test``, put at ``path`` in the pristine sample, passes.

    Remembered by the file's text: the pristine sample never changes, and the
    crash sweep judges thousands of worlds whose tests are mostly the same bytes.
    """
    with tempfile.TemporaryDirectory() as scratch:
        pristine = Path(scratch) / "sample"
        shutil.copytree(original_sample_dir(), pristine)
        (pristine / path).write_bytes(test)
        return run_sample_tests(pristine, only=[path]).ok


_passing: set[bytes] = set()
"""Digests of workspaces (every file's path and bytes) whose whole suite passed."""


def _tests_pass_on_patched(s: _Scene) -> _Result:
    # The suite's verdict is a function of the files it runs, and the crash sweep
    # judges thousands of worlds holding the same ones. Only passes are kept: a
    # failure's summary names the paths of its world, so it is found afresh.
    digest = _workspace_digest(s.world.workspace)
    if digest in _passing:
        return None
    report = run_sample_tests(s.world.workspace)
    if report.ok:
        _passing.add(digest)
    return None if report.ok else report.summary()


def _workspace_digest(root: Path) -> bytes:
    """Every file under ``root`` (hidden ones too; not ``__pycache__``): paths and bytes."""
    digest = hashlib.sha256()
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = sorted(d for d in subdirectories if d != "__pycache__")
        for name in sorted(files):
            path = os.path.join(directory, name)
            with open(path, "rb") as file:
                contents = file.read()
            relative = os.path.relpath(path, root).encode()
            digest.update(b"%d:%s%d:" % (len(relative), relative, len(contents)))
            digest.update(contents)
    return digest.digest()


def _patch_applied_once(s: _Scene) -> _Result:
    problems = []
    applied = Counter(entry["path"] for entry in applied_patches(s.world))
    expected: dict[str, str] = {}
    for group in s.task.groups:
        path = group.patch.path
        base = expected.get(path) or (original_sample_dir() / path).read_text()
        expected[path] = base.replace(group.patch.old, group.patch.new, 1)
    for path, content in expected.items():
        wanted = sum(1 for g in s.task.groups if g.patch.path == path)
        if applied[path] != wanted:
            problems.append(f"{path} patched {applied[path]} times, expected {wanted}")
        if (s.world.workspace / path).read_text() != content:
            problems.append(f"{path} differs from the original with its patch applied once")
    return "; ".join(problems) if problems else None


def _only_expected_files(s: _Scene) -> _Result:
    allowed = {g.patch.path for g in s.task.groups} | {
        g.regression_test.path for g in s.task.groups
    }
    changed = []
    for path in _files(s.world.workspace):
        if _pristine(path) != (s.world.workspace / path).read_bytes():
            changed.append(path)
    unexpected = sorted(set(changed) - allowed)
    return f"unexpected changes: {', '.join(unexpected)}" if unexpected else None


@functools.lru_cache(maxsize=256)
def _pristine(path: str) -> bytes | None:
    """A file of the bundled sample (which never changes), or None if it has none."""
    original = original_sample_dir() / path
    return original.read_bytes() if original.is_file() else None


def _comments(s: _Scene) -> _Result:
    problems = []
    comments = s.tracker.comments()
    bodies = Counter((c.issue, c.body) for c in comments)
    problems += [
        f"#{issue} has {n} comments saying {body[:30]!r}"
        for (issue, body), n in bodies.items()
        if n > 1
    ]
    commented = {c.issue for c in comments}
    problems += [
        f"#{i.number} has no comment" for i in s.tracker.issues() if i.number not in commented
    ]
    return "; ".join(problems) if problems else None


def _workspace_hashes(s: _Scene) -> _Result:
    wrong = []
    for path, digest in s.state.workspace.items():
        file = s.world.workspace / path
        if not file.is_file() or sha256_bytes(file.read_bytes()) != digest:
            wrong.append(path)
    return f"differ from the state: {', '.join(wrong)}" if wrong else None


def _checkpoint_modes(s: _Scene) -> _Result:
    problems = []
    mode = stat.S_IMODE(s.store_dir.stat().st_mode)
    if mode != 0o700:
        problems.append(f"{s.store_dir} is {mode:o}, not 700")
    for entry in s.store_dir.iterdir():
        file_mode = stat.S_IMODE(entry.lstat().st_mode)
        if entry.name.startswith(s.state.run_id) and file_mode != 0o600:
            problems.append(f"{entry.name} is {file_mode:o}, not 600")
    return "; ".join(problems) if problems else None


def _no_leftover_temp(s: _Scene) -> _Result:
    left = [p.name for p in s.store_dir.iterdir() if p.name.endswith(".tmp")]
    left += [p for p in _files(s.world.workspace, hidden=True) if p.endswith(".tmp")]
    return f"left over: {', '.join(left)}" if left else None


def _spending(s: _Scene) -> _Result:
    replies = [m for m in s.state.messages if isinstance(m, AssistantMessage)]
    usage = sum((r.usage for r in replies), Usage())
    dollars = sum(r.dollars for r in replies)
    if s.state.summarized:
        return None  # replies folded into the summary are no longer itemised
    if usage != s.state.usage or abs(dollars - s.state.dollars) > 1e-9:
        return f"the run's totals ({s.state.dollars:.6f}) differ from its replies' ({dollars:.6f})"
    return None


def _no_reply_paid_twice(s: _Scene) -> _Result:
    asked_again = CallLog(s.world.model_log).paid_twice(s.state.run_id)
    # A reply lost before its save is asked for again, as it must be; the restart that
    # found its model-call marker counted it (`unsaved_replies`). Any repeat beyond
    # those asked again for a reply that was saved.
    twice = asked_again - s.state.unsaved_replies
    if twice > 0:
        return (
            f"{twice} model calls asked again for a turn already asked for "
            f"({asked_again} repeats, {s.state.unsaved_replies} of them for replies lost "
            "before their save)"
        )
    return None


def _keys_on_writes(s: _Scene) -> _Result:
    calls = {
        idempotency_key(s.state.run_id, call.id)
        for m in s.state.messages
        if isinstance(m, AssistantMessage)
        for call in m.calls
    }
    problems = []
    for request in s.tracker.requests():
        if request.key is None:
            problems.append(f"request {request.seq} ({request.operation}) carried no key")
        elif request.key not in calls:
            problems.append(f"request {request.seq} carried a key of no saved call")
    return "; ".join(problems) if problems else None


CHECKS: tuple[tuple[str, Callable[[_Scene], _Result]], ...] = (
    ("run finished with an answer", _finished),
    ("one issue per crash group", _one_issue_per_group),
    ("no issue filed twice", _no_duplicate_issues),
    ("issue bodies name their reports", _bodies_name_reports),
    ("regression tests exist", _tests_exist),
    ("regression tests fail on the original code", _tests_fail_on_original),
    ("all tests pass on the patched code", _tests_pass_on_patched),
    ("each patch applied exactly once", _patch_applied_once),
    ("only expected files changed", _only_expected_files),
    ("comments posted once each", _comments),
    ("workspace matches the recorded hashes", _workspace_hashes),
    ("checkpoint modes 0700/0600", _checkpoint_modes),
    ("no leftover temp files", _no_leftover_temp),
    ("spending equals the saved replies' usage", _spending),
    ("no reply paid twice", _no_reply_paid_twice),
    ("keys carried on every tracker write", _keys_on_writes),
)
"""The sixteen checks, in the order they are reported."""


def run_checks(*, world: World, state: RunState, store_dir: Path) -> list[Check]:
    """Judge a run's world; one :class:`Check` per entry of :data:`CHECKS`."""
    with world.tracker() as tracker:
        scene = _Scene(
            world=world, task=world.load_task(), tracker=tracker, state=state, store_dir=store_dir
        )
        verdicts = []
        for name, check in CHECKS:
            try:
                reason = check(scene)
            except Exception as exc:  # noqa: BLE001 - a check that cannot run is a failed check, with its reason
                reason = f"could not check: {type(exc).__name__}: {exc}"
            verdicts.append(Check(name=name, ok=reason is None, reason=reason or ""))
    return verdicts


def _files(root: Path, *, hidden: bool = False) -> list[str]:
    found = []
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = [d for d in subdirectories if d != "__pycache__"]
        for name in files:
            if name.endswith(".pyc") or (name.startswith(".") and not hidden):
                continue
            found.append(str(Path(directory, name).relative_to(root)))
    return found
