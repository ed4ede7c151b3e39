"""The triage world: the sample and its planted bugs, the tasks' ground truth, the runner."""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
import traceback
from importlib import resources
from pathlib import Path

import pytest

from durably.triage.runner import _compile, reproduce, run_sample_tests
from durably.triage.tracker import Tracker
from durably.triage.world import (
    TASKS,
    Group,
    UnknownTask,
    World,
    WorldError,
    load_task,
    original_sample_dir,
)

CASES = [(name, group) for name in TASKS for group in load_task(name).groups]
CASE_IDS = [f"{name}:{group.cause}" for name, group in CASES]
FRAME = re.compile(
    r'^  File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)\n(?P<quoted>    .*\n)?',
    re.M,
)
PREFIX = re.compile(r'File "[^"]*?/(?=(todo|tests)/)')


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    """A private copy of the pristine sample, which the test may edit."""
    return Path(shutil.copytree(original_sample_dir(), tmp_path / "sample"))


def apply(root: Path, group: Group) -> None:
    """Apply the group's reference patch exactly as the agent's patch tool would."""
    path = root / group.patch.path
    text = path.read_text(encoding="utf-8")
    assert text.count(group.patch.old) == 1, f"{group.patch.path}: old text must occur once"
    path.write_text(text.replace(group.patch.old, group.patch.new, 1), encoding="utf-8")


def add_regression_test(root: Path, group: Group) -> str:
    """Write the group's regression test into the copy; return its node-ID file name."""
    path = root / group.regression_test.path
    assert not path.exists()
    path.write_text(group.regression_test.content, encoding="utf-8")
    return group.regression_test.path


# -- the sample and the tasks ----------------------------------------------------


def test_pristine_sample_passes_its_own_tests() -> None:
    """Every test bundled with the sample passes on the original code."""
    report = run_sample_tests(original_sample_dir())
    assert report.ok, report.summary()
    assert len(report.passed) >= 10
    assert report.summary() == f"{len(report.passed)} passed"


def test_sample_and_tasks_ship_as_package_data() -> None:
    """The sample and every task's files are found through importlib.resources."""
    triage = resources.files("durably.triage")
    assert triage.joinpath("sample", "todo", "store.py").is_file()
    assert triage.joinpath("sample", "tests", "test_store.py").is_file()
    for name in TASKS:
        for file_name in ("reports.json", "expected.json"):
            assert triage.joinpath("tasks", name, file_name).is_file(), (name, file_name)


def test_tasks_are_ordered_and_m1_comes_first() -> None:
    """The demo's task is the first, and the batches have the shape the checks rely on."""
    assert TASKS[0] == "m1-done-after-delete"
    shapes = {name: [len(group.reports) for group in load_task(name).groups] for name in TASKS}
    assert len(shapes["m1-done-after-delete"]) == 2
    assert sum(shapes["m1-done-after-delete"]) >= 5
    assert shapes["m2-due-date-zulu"][0] >= 3
    assert len(shapes["m2-due-date-zulu"]) == 1
    assert len(shapes["m3-unicode-export"]) == 2


def test_unknown_task_names_the_known_ones() -> None:
    """Loading a task that does not exist fails with a message listing every known task."""
    with pytest.raises(UnknownTask) as caught:
        load_task("m9-nope")
    assert all(name in str(caught.value) for name in TASKS)


@pytest.mark.parametrize(("task", "group"), CASES, ids=CASE_IDS)
def test_regression_test_fails_before_the_patch_and_passes_after(
    sample: Path, task: str, group: Group
) -> None:
    """Each group's regression test fails on the original code and passes once its patch is in."""
    test_file = add_regression_test(sample, group)
    before = run_sample_tests(sample, only=[test_file])
    assert before.failed, before.summary()
    assert not before.passed, before.summary()
    apply(sample, group)
    after = run_sample_tests(sample)
    assert after.ok, after.summary()
    assert any(name.startswith(test_file + "::") for name in after.passed)


@pytest.mark.parametrize("task", TASKS)
def test_all_patches_of_a_task_apply_together(sample: Path, task: str) -> None:
    """The patches of one task touch disjoint text, and with all of them every test passes."""
    groups = load_task(task).groups
    for group in groups:
        add_regression_test(sample, group)
        apply(sample, group)
    report = run_sample_tests(sample)
    assert report.ok, report.summary()


@pytest.mark.parametrize(("task", "group"), CASES, ids=CASE_IDS)
def test_each_report_crashes_until_its_group_is_patched(
    sample: Path, task: str, group: Group
) -> None:
    """Every report of a group crashes the original sample, and none does after its patch."""
    reports = [load_task(task).report(report_id) for report_id in group.reports]
    for report in reports:
        assert reproduce(sample, report.input) is not None, report.id
    apply(sample, group)
    for report in reports:
        crash = reproduce(sample, report.input)
        assert crash is None, (report.id, crash)


@pytest.mark.parametrize("task", TASKS)
def test_tracebacks_are_what_the_sample_prints(task: str) -> None:
    """Each report's traceback is exactly the one its input produces on the sample, paths aside."""
    for report in load_task(task).reports:
        crash = reproduce(original_sample_dir(), report.input)
        assert crash is not None, report.id
        assert PREFIX.sub('File "', report.traceback) == crash.traceback, report.id


@pytest.mark.parametrize("task", TASKS)
def test_traceback_frames_quote_real_lines(task: str) -> None:
    """Every frame of every report names a file and line of the sample holding the quoted text."""
    sample = original_sample_dir()
    for report in load_task(task).reports:
        frames = list(FRAME.finditer(report.traceback))
        assert frames, report.id
        for frame in frames:
            relative = frame["path"][frame["path"].rindex("todo/") :]
            lines = (sample / relative).read_text(encoding="utf-8").splitlines()
            quoted = (frame["quoted"] or "").strip()
            assert lines[int(frame["line"]) - 1].strip() == quoted, (report.id, frame[0])


def test_reports_of_one_group_share_their_innermost_frame() -> None:
    """Within a group, crashes end in the same function, so grouping by traceback is possible."""
    for name in TASKS:
        task = load_task(name)
        for group in task.groups:
            ends = {
                list(FRAME.finditer(task.report(report_id).traceback))[-1]["function"]
                for report_id in group.reports
            }
            assert len(ends) == 1, (name, group.cause, ends)


# -- the runner ------------------------------------------------------------------


def test_runner_leaves_no_modules_behind(sample: Path) -> None:
    """A run removes every module it loaded and never imports the sample as ``todo``."""
    before = set(sys.modules)
    run_sample_tests(sample)
    reproduce(sample, ["add 'x'", "export"])
    assert set(sys.modules) - before == set()
    assert "todo" not in sys.modules


def test_runner_sees_an_edit_of_the_same_size_at_once(sample: Path) -> None:
    """An edit is seen by the next run, even one of the same size within the same second."""
    path = sample / "todo" / "text.py"
    original = path.read_text(encoding="utf-8")
    stamp = path.stat()
    assert run_sample_tests(sample).ok
    edited = original.replace("text[0].upper()", "text[0].lower()")
    assert len(edited) == len(original)
    assert edited != original
    path.write_text(edited, encoding="utf-8")
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    report = run_sample_tests(sample)
    assert not report.ok
    assert "tests/test_text.py::test_normalize_title" in dict(report.failed)
    assert not list(sample.rglob("__pycache__"))


def test_two_workspaces_never_share_code(tmp_path: Path) -> None:
    """Runs on two copies see each copy's own code, whichever ran first."""
    good = Path(shutil.copytree(original_sample_dir(), tmp_path / "good"))
    bad = Path(shutil.copytree(original_sample_dir(), tmp_path / "bad"))
    store = bad / "todo" / "store.py"
    store.write_text(
        store.read_text(encoding="utf-8").replace("self._next_id = 1", "self._next_id = 9"),
        encoding="utf-8",
    )
    assert not run_sample_tests(bad).ok
    assert run_sample_tests(good).ok
    assert not run_sample_tests(bad).ok


def test_broken_file_is_a_failure_not_an_exception(sample: Path) -> None:
    """A syntax error in the code under test shows as failures naming it, never as a raise."""
    path = sample / "todo" / "dates.py"
    path.write_text(path.read_text(encoding="utf-8") + "\ndef broken(:\n", encoding="utf-8")
    report = run_sample_tests(sample)
    assert not report.ok
    assert not report.passed
    name, error = report.failed[0]
    assert name.startswith("tests/")
    assert name.endswith(".py")
    assert error.startswith("SyntaxError")
    assert "todo/dates.py" in report.tracebacks[name]


def test_failures_name_the_test_and_the_error(sample: Path) -> None:
    """A failing test is reported by node ID with its exception in one line, and in the summary."""
    path = sample / "tests" / "test_regression_x.py"
    path.write_text(
        "from todo import TodoList\n\n\n"
        "def test_done_after_delete() -> None:\n"
        "    todos = TodoList()\n"
        "    todos.add('a')\n"
        "    todos.delete(1)\n"
        "    todos.mark_done(1)\n\n\n"
        "def test_bare_assert() -> None:\n"
        "    assert 1 + 1 == 3\n",
        encoding="utf-8",
    )
    report = run_sample_tests(sample, only=["test_regression_x.py"])
    failed = dict(report.failed)
    assert failed["tests/test_regression_x.py::test_done_after_delete"] == "KeyError: 1"
    bare = failed["tests/test_regression_x.py::test_bare_assert"]
    assert bare == "AssertionError: assert 1 + 1 == 3 (tests/test_regression_x.py:12)"
    assert report.summary().startswith(
        "0 passed, 2 failed: tests/test_regression_x.py::test_done_after_delete (KeyError: 1)"
    )
    trace = report.tracebacks["tests/test_regression_x.py::test_done_after_delete"]
    assert 'File "todo/store.py", line' in trace
    assert "runner.py" not in trace


def test_only_selects_by_file_function_or_node_and_flags_typos() -> None:
    """``only`` accepts files, function names and node IDs, and an entry matching nothing fails."""
    sample = original_sample_dir()
    by_file = run_sample_tests(sample, only=["tests/test_text.py"])
    assert by_file.ok
    assert all(name.startswith("tests/test_text.py::") for name in by_file.passed)
    by_name = run_sample_tests(sample, only=["test_slugify"])
    assert by_name.passed == ["tests/test_text.py::test_slugify"]
    by_node = run_sample_tests(sample, only=["test_dates.py::test_format_and_overdue"])
    assert by_node.passed == ["tests/test_dates.py::test_format_and_overdue"]
    typo = run_sample_tests(sample, only=["test_slugfy"])
    assert not typo.ok
    assert typo.failed == [("test_slugfy", "no such test")]


def test_code_compiled_once_names_each_workspace_s_own_file(tmp_path: Path) -> None:
    """Code is compiled once per source text, yet every function names its own copy's file."""
    source = b"def outer():\n    def inner():\n        raise KeyError(1)\n    inner()\n"
    first = _compile(source, str(tmp_path / "a" / "x.py"))
    second = _compile(source, str(tmp_path / "b" / "x.py"))
    namespace: dict[str, object] = {}
    exec(second, namespace)  # noqa: S102 - the point is to run it
    outer = namespace["outer"]
    assert callable(outer)
    with pytest.raises(KeyError) as caught:
        outer()
    frames = [entry.filename for entry in traceback.extract_tb(caught.value.__traceback__)]
    assert frames[-2:] == [str(tmp_path / "b" / "x.py")] * 2
    assert first.co_filename == str(tmp_path / "a" / "x.py")


# -- worlds ----------------------------------------------------------------------


def test_world_create_copies_the_sample_with_plain_modes(tmp_path: Path) -> None:
    """A new world holds a copy of the sample (files 0644, dirs 0755) and an empty tracker."""
    world = World.create(tmp_path / "world", "m1-done-after-delete")
    assert world.workspace == tmp_path / "world" / "workspace"
    assert world.model_log == tmp_path / "world" / "model_calls.jsonl"
    copied = sorted(p.relative_to(world.workspace) for p in world.workspace.rglob("*"))
    pristine = sorted(
        p.relative_to(original_sample_dir()) for p in original_sample_dir().rglob("*")
    )
    assert copied == [p for p in pristine if "__pycache__" not in p.parts]
    for path in world.workspace.rglob("*"):
        expected = 0o755 if path.is_dir() else 0o644
        assert stat.S_IMODE(path.stat().st_mode) == expected, path
    assert Tracker(world.tracker_path).issues() == []
    assert run_sample_tests(world.workspace).ok


def test_world_open_and_ensure_find_the_same_world(tmp_path: Path) -> None:
    """A world made once is found again by open and ensure, and never made twice."""
    made = World.ensure(tmp_path / "world", "m2-due-date-zulu")
    (made.workspace / "todo" / "marker.txt").write_text("kept", encoding="utf-8")
    assert World.open(tmp_path / "world") == made
    assert World.ensure(tmp_path / "world", "m2-due-date-zulu") == made
    assert (made.workspace / "todo" / "marker.txt").exists()
    assert made.load_task().name == "m2-due-date-zulu"
    with pytest.raises(WorldError, match="already holds a world"):
        World.create(tmp_path / "world", "m2-due-date-zulu")
    with pytest.raises(WorldError, match="m2-due-date-zulu"):
        World.ensure(tmp_path / "world", "m1-done-after-delete")


def test_world_open_without_a_world_is_a_clear_error(tmp_path: Path) -> None:
    """Opening a directory that holds no world says so and how to make one."""
    with pytest.raises(WorldError, match=r"no world .*World.create"):
        World.open(tmp_path)
