"""The listing index: summaries come from it only while they are what loading the runs gives."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _helpers.patience import stretched
from durably import listing
from durably.listing import Listing, RunSummary, list_directory, list_runs_fully, select
from durably.state import (
    Approval,
    ApprovalKind,
    AssistantMessage,
    Phase,
    RunState,
    ToolCall,
    ToolResult,
    UserMessage,
)
from durably.stores import _index
from durably.stores.directory import DirectoryStore
from durably.stores.file import FileStore
from durably.stores.journal import JournalStore

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def a_state(
    run_id: str,
    *,
    turns: int = 1,
    phase: Phase = Phase.DONE,
    dollars: float = 0.01,
    resumes: int = 0,
    waiting: int = 0,
    saved: int = 0,
) -> RunState:
    """A run of ``turns`` replies; ``waiting`` approvals on its last reply when paused."""
    state = RunState(
        run_id=run_id,
        task=f"task of {run_id}",
        created_at=T0,
        messages=[UserMessage(text="go")],
        phase=phase,
        dollars=dollars,
        resumes=resumes,
        saved_at=T0 + timedelta(minutes=saved),
    )
    for n in range(1, turns + 1):
        calls = tuple(
            ToolCall(id=f"c{n}-{k}", name="refund", arguments=f'{{"n": {n}, "k": {k}}}')
            for k in range(max(1, waiting if n == turns else 1))
        )
        state.messages.append(AssistantMessage(text=f"turn {n}", calls=calls, turn=n))
        if n < turns or not waiting:
            for call in calls:
                state.messages.append(ToolResult(call_id=call.id, name="refund", content="ok"))
    state.turns = turns
    if waiting:
        state.phase = Phase.PAUSED
        state.pending = {
            f"c{turns}-{k}": Approval(
                call_id=f"c{turns}-{k}",
                tool="refund",
                arguments=f'{{"n": {turns}, "k": {k}}}',
                asked_at=T0,
                kind=ApprovalKind.APPROVE if k % 2 == 0 else ApprovalKind.RESOLVE,
                why=None if k % 2 == 0 else "no lookup",
            )
            for k in range(waiting)
        }
    return state


def save_run(directory: Path, state: RunState, *, journal: bool, saves: int = 1) -> None:
    """Create the run (snapshot or journal layout) and save it ``saves`` more times."""
    store: FileStore = (
        JournalStore(directory, sync=False, compact_min_bytes=0, compact_ratio=2.0)
        if journal
        else FileStore(directory, sync=False)
    )
    try:
        handle = store.create_sync(state)
        for n in range(saves):
            state.dollars += 0.001 * (n + 1)
            handle.save_sync(state)
        handle.close_sync()
    finally:
        store.close_sync()


def resave(directory: Path, run_id: str, **changes: object) -> None:
    """Open a run with the store that wrote it, change fields, save."""
    store = DirectoryStore(directory, sync=False)
    try:
        journal, snapshot = store._journal, store._snapshot  # noqa: SLF001 -- saving through the store that owns the run
        owner = journal if _is_journal(directory, run_id) else snapshot
        handle, state = owner.open_sync(run_id)
        for name, value in changes.items():
            setattr(state, name, value)
        handle.save_sync(state)
        handle.close_sync()
    finally:
        store.close_sync()


def _is_journal(directory: Path, run_id: str) -> bool:
    return any(directory.glob(f"{run_id}.*.log"))


def settle(directory: Path, *, round_: int = 0) -> None:
    """Make files changed in the last minutes look untouched for an hour, as quiet runs are.

    Each round gets its own old time, so a file changed between two rounds never
    shows the same modification time twice; files settled before are left as they are.
    """
    now = time.time()
    old = now - 3600 + round_
    for path in directory.iterdir():
        if not path.name.startswith(".") and path.lstat().st_mtime > now - 600:
            os.utime(path, (old, old), follow_symlinks=False)


def through_index(directory: Path) -> Listing:
    """List ``directory`` through the listing index."""
    store = JournalStore(directory, sync=False)
    try:
        return list_directory(store)
    finally:
        store.close_sync()


def fully(directory: Path) -> Listing:
    """List ``directory`` by loading every run (the reference)."""
    store = JournalStore(directory, sync=False)
    try:
        return asyncio.run(list_runs_fully(store))
    finally:
        store.close_sync()


def same(a: Listing, b: Listing) -> None:
    """Assert two listings show the same summaries and the same unreadable runs."""
    assert a.summaries == b.summaries
    assert [(run, str(exc)) for run, exc in a.unreadable] == [
        (run, str(exc)) for run, exc in b.unreadable
    ]


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """Six settled runs, three per file store, one paused with two questions."""
    directory = tmp_path / "runs"
    for n in range(6):
        state = a_state(f"run-{n}", turns=n + 1, waiting=2 if n == 4 else 0, saved=n)
        save_run(directory, state, journal=n % 2 == 1, saves=n)
    settle(directory)
    return directory


def test_a_warm_index_loads_no_run_and_lists_what_loading_gives(runs: Path) -> None:
    """Once the index is written, a listing of unchanged runs loads none and equals the full one."""
    cold = through_index(runs)
    assert cold.loaded == 6
    assert (runs / _index.INDEX_NAME).exists()

    warm = through_index(runs)

    assert warm.loaded == 0
    same(warm, cold)
    same(warm, fully(runs))
    paused = next(s for s in warm.summaries if s.run_id == "run-4")
    assert [q.call_id for q in paused.questions] == ["c5-0", "c5-1"]


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda p: p.unlink(), id="missing"),
        pytest.param(lambda p: p.write_bytes(p.read_bytes()[:-40]), id="cut"),
        pytest.param(
            lambda p: p.write_bytes(p.read_bytes().replace(b'"turns":3', b'"turns":9')),
            id="edited-without-crc",
        ),
        pytest.param(lambda p: p.write_bytes(b"\x00" * 64), id="zeroed"),
        pytest.param(lambda p: p.chmod(0o644), id="readable-by-others"),
        pytest.param(lambda p: p.chmod(0o620), id="writable-by-group"),
        pytest.param(
            lambda p: p.write_bytes(p.read_bytes().replace(b"durably-index 1", b"durably-index 7")),
            id="other-format",
        ),
    ],
)
def test_a_missing_damaged_or_exposed_index_is_ignored_and_rebuilt(runs: Path, spoil) -> None:  # type: ignore[no-untyped-def]
    """An index that is missing, damaged, of another format or not private is rebuilt, silently."""
    first = through_index(runs)
    index = runs / _index.INDEX_NAME
    spoil(index)

    again = through_index(runs)

    assert again.loaded == 6
    same(again, first)
    assert index.stat().st_mode & 0o777 == 0o600
    assert through_index(runs).loaded == 0


def test_an_index_owned_by_another_user_is_not_read(
    runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An index another user owns is not read (its entries could be forged)."""
    through_index(runs)
    store = JournalStore(runs)
    assert len(_index.load(store)) == 6  # the directory is open and checked already
    real_uid = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: real_uid + 1)  # now the index looks foreign

    try:
        assert _index.load(store) == {}
    finally:
        store.close_sync()


def test_a_run_saved_after_the_index_was_written_is_listed_with_its_new_values(
    runs: Path,
) -> None:
    """A run saved after the index was written is loaded again and listed as it is now."""
    through_index(runs)
    resave(runs, "run-1", turns=40, phase=Phase.DONE)  # a journal run: one append
    resave(runs, "run-2", turns=41)  # a snapshot run: a new file
    settle(runs, round_=1)

    listed = through_index(runs)

    assert listed.loaded == 2
    turns = {s.run_id: s.turns for s in listed.summaries}
    assert (turns["run-1"], turns["run-2"]) == (40, 41)
    same(listed, fully(runs))


def test_a_run_damaged_after_the_index_was_written_is_listed_as_unreadable(runs: Path) -> None:
    """A run torn after the index recorded it is unreadable in the listing, as a full load says."""
    through_index(runs)
    snapshot = runs / "run-2.json"
    snapshot.write_bytes(snapshot.read_bytes()[:50])

    listed = through_index(runs)

    assert [run for run, _ in listed.unreadable] == ["run-2"]
    assert "run-2" not in [s.run_id for s in listed.summaries]
    same(listed, fully(runs))


def test_runs_added_and_removed_since_the_index_are_listed_as_they_are(runs: Path) -> None:
    """A new run is listed and a removed one is not, whatever the index remembers."""
    through_index(runs)
    save_run(runs, a_state("run-new"), journal=True)
    for name in ("run-0.json", "run-0.lock"):
        (runs / name).unlink()

    listed = through_index(runs)

    assert [s.run_id for s in listed.summaries] == [f"run-{n}" for n in range(1, 6)] + ["run-new"]
    same(listed, fully(runs))


def test_a_run_saved_moments_ago_is_loaded_by_every_listing(tmp_path: Path) -> None:
    """A run whose files changed within the settle time is not recorded: it is loaded again."""
    save_run(tmp_path, a_state("fresh"), journal=True)

    assert through_index(tmp_path).loaded == 1
    assert through_index(tmp_path).loaded == 1
    settle(tmp_path)
    assert through_index(tmp_path).loaded == 1
    assert through_index(tmp_path).loaded == 0


def test_a_snapshot_put_back_behind_a_newer_log_is_listed_as_unreadable(runs: Path) -> None:
    """A journal run whose snapshot was put back while a newer log holds saves is unreadable
    in the listing (the lister's own listing of the run's files finds that log).
    """
    store = JournalStore(runs, sync=False, compact_min_bytes=0, compact_ratio=0.0)
    state = a_state("rolled", turns=1)
    handle = store.create_sync(state)
    old = {p.name: p.read_bytes() for p in runs.glob("rolled.*") if p.suffix != ".lock"}
    state.turns = 2
    handle.save_sync(state)  # compacts: generation 2
    store.compact_ratio = 1e9
    state.turns = 3
    handle.save_sync(state)  # appended to generation 2's log
    handle.close_sync()
    store.close_sync()
    for name, data in old.items():
        (runs / name).write_bytes(data)
    (runs / "rolled.lock").write_bytes(b"")

    listed = through_index(runs)

    assert [run for run, _ in listed.unreadable] == ["rolled"]
    assert "holds later saves" in str(listed.unreadable[0][1])
    same(listed, fully(runs))


def test_the_directory_store_and_a_snapshot_file_store_list_through_the_index(runs: Path) -> None:
    """``list_runs`` over a DirectoryStore or a FileStore uses the index and sees journal runs."""
    through_index(runs)
    for store in (DirectoryStore(runs), FileStore(runs)):
        try:
            listed = asyncio.run(listing.list_runs(store))
        finally:
            store.close_sync()
        assert listed.loaded == 0
        assert len(listed.summaries) == 6


def test_select_filters_by_phase_sorts_by_last_saved_and_limits() -> None:
    """``select`` keeps one phase, puts the newest save first (never-saved last), and cuts."""

    def summary(run: str, phase: str, minute: int | None) -> RunSummary:
        return RunSummary(
            run_id=run,
            phase=phase,
            turns=1,
            dollars=0.0,
            resumes=0,
            created_at=T0,
            saved_at=None if minute is None else T0 + timedelta(minutes=minute),
        )

    runs = [
        summary("a", "done", 3),
        summary("b", "paused", 9),
        summary("c", "done", None),
        summary("d", "done", 7),
        summary("e", "done", 7),
    ]

    assert [s.run_id for s in select(runs)] == ["b", "d", "e", "a", "c"]
    assert [s.run_id for s in select(runs, phase="done")] == ["d", "e", "a", "c"]
    assert [s.run_id for s in select(runs, phase="done", limit=2)] == ["d", "e"]
    assert [s.run_id for s in select(runs, sort="run", limit=3)] == ["a", "b", "c"]
    assert select(runs, phase="model") == []
    with pytest.raises(ValueError, match="unknown sort"):
        select(runs, sort="size")


_run_spec = st.fixed_dictionaries(
    {
        "journal": st.booleans(),
        "turns": st.integers(0, 4),
        "waiting": st.integers(0, 3),
        "resumes": st.integers(0, 3),
        "saves": st.integers(0, 4),
        "damage": st.sampled_from(["none", "none", "torn snapshot", "log byte", "symlink"]),
        "later": st.sampled_from(["nothing", "nothing", "resave", "damage", "remove"]),
    }
)


def _damage(directory: Path, run_id: str, how: str) -> None:
    snapshot = directory / f"{run_id}.json"
    if how == "torn snapshot":
        snapshot.write_bytes(snapshot.read_bytes()[: snapshot.stat().st_size // 2])
    elif how == "log byte":
        logs = sorted(directory.glob(f"{run_id}.*.log"))
        if logs:
            data = bytearray(logs[0].read_bytes())
            data[len(data) // 3] ^= 0x40
            logs[0].write_bytes(bytes(data))
    elif how == "symlink":
        target = directory.parent / f"elsewhere-{run_id}.json"
        snapshot.rename(target)
        snapshot.symlink_to(target)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(specs=st.lists(_run_spec, min_size=1, max_size=6))
def test_the_index_listing_equals_loading_every_run(specs: list[dict[str, object]]) -> None:
    """Over generated stores of both layouts, damaged runs and later changes, the listing
    through the index (cold, warm and after changes) equals loading every run.
    """
    with tempfile.TemporaryDirectory() as temp:
        directory = Path(temp) / "runs"
        for n, spec in enumerate(specs):
            state = a_state(
                f"r{n}",
                turns=int(spec["turns"]),  # type: ignore[call-overload]
                waiting=int(spec["waiting"]) if spec["turns"] else 0,  # type: ignore[call-overload]
                resumes=int(spec["resumes"]),  # type: ignore[call-overload]
                saved=n,
            )
            save_run(directory, state, journal=bool(spec["journal"]), saves=int(spec["saves"]))  # type: ignore[call-overload]
            _damage(directory, f"r{n}", str(spec["damage"]))
        settle(directory)
        cold = through_index(directory)
        same(cold, fully(directory))
        same(through_index(directory), cold)

        for n, spec in enumerate(specs):
            run_id, later = f"r{n}", spec["later"]
            readable = run_id in {s.run_id for s in cold.summaries}
            if later == "resave" and readable:
                resave(directory, run_id, turns=99, resumes=7)
            elif later == "damage":
                _damage(directory, run_id, "torn snapshot" if readable else "none")
            elif later == "remove":
                (directory / f"{run_id}.json").unlink()
        settle(directory, round_=1)
        after = through_index(directory)
        same(after, fully(directory))
        same(through_index(directory), after)


_KILLED_LISTER = """
import os, sys, time
from durably import listing
from durably._sysio import FileSystem
from durably.stores.journal import JournalStore

class StallInIndexWrite(FileSystem):
    index_fds = set()

    def open(self, name, flags, mode, *, dir_fd):
        fd = super().open(name, flags, mode, dir_fd=dir_fd)
        if name.startswith("..durably-index."):
            self.index_fds.add(fd)
        return fd

    def write(self, fd, data):
        if fd in self.index_fds:
            os.write(fd, data[: len(data) // 2])
            print("half", flush=True)
            time.sleep(60)
        super().write(fd, data)

store = JournalStore(sys.argv[1], fs=StallInIndexWrite())
listing.list_directory(store)
print("finished", flush=True)
"""


@pytest.mark.parametrize("index_before", [False, True], ids=["no-index", "old-index"])
def test_a_lister_killed_mid_index_write_leaves_a_correct_listing(
    runs: Path, tmp_path: Path, index_before: bool
) -> None:
    """A lister SIGKILLed halfway through writing the index leaves listings that are still right."""
    if index_before:
        through_index(runs)
        resave(runs, "run-3", turns=77)  # the old index is now stale for run-3
        settle(runs, round_=1)
    script = tmp_path / "lister.py"
    script.write_text(_KILLED_LISTER)
    with subprocess.Popen(
        [sys.executable, str(script), str(runs)], stdout=subprocess.PIPE, text=True
    ) as lister:
        try:
            assert lister.stdout is not None
            assert lister.stdout.readline().strip() == "half"
        finally:
            lister.send_signal(signal.SIGKILL)
            lister.wait(timeout=stretched(30))
    assert lister.returncode == -signal.SIGKILL
    left = [p.name for p in runs.iterdir() if p.name.startswith("..durably-index.")]
    assert len(left) == 1  # the half-written temp, never renamed over the index

    listed = through_index(runs)

    same(listed, fully(runs))
    assert {s.run_id: s.turns for s in listed.summaries}["run-3"] == (77 if index_before else 4)
    assert through_index(runs).loaded == 0


def test_an_index_temp_left_by_a_killed_lister_is_removed_once_old(runs: Path) -> None:
    """A killed lister's temp is removed by a later index write once it is a minute old."""
    young = runs / "..durably-index.0123456789abcdef.tmp"
    old = runs / "..durably-index.fedcba9876543210.tmp"
    for temp in (young, old):
        temp.write_bytes(b"half")
    long_ago = time.time() - 3600
    os.utime(old, (long_ago, long_ago))

    through_index(runs)

    assert young.exists()
    assert not old.exists()


# -- the commands and the console use the summaries ----------------------------------------


def durably_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``durably ARGV`` in this process; return its exit code, stdout and stderr."""
    from durably.cli import main

    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(exited.value.code or 0), out, err


def table_rows(out: str) -> list[list[str]]:
    """The cells of each body row of a drawn runs table."""
    return [
        [cell.strip() for cell in line.strip("│ ").split("│")]
        for line in out.splitlines()
        if line.startswith("│")
    ]


def test_runs_lists_last_saved_first_and_takes_phase_limit_and_sort(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``durably runs`` puts the last saved first, keeps one ``--phase``, cuts at ``--limit``,
    and ``--sort run`` orders by run ID.
    """
    code, out, _ = durably_cli(capsys, "runs", str(runs))
    assert code == 0
    rows = table_rows(out)
    assert [r[0] for r in rows] == [f"run-{n}" for n in (5, 4, 3, 2, 1, 0)]
    assert rows[-1] == ["run-0", "done", "1", "$0.0100", "0", rows[-1][5]]

    _, out, _ = durably_cli(capsys, "runs", str(runs), "--phase", "paused")
    assert [r[:2] for r in table_rows(out)] == [["run-4", "paused"]]

    _, out, _ = durably_cli(capsys, "runs", str(runs), "--limit", "2")
    assert [r[0] for r in table_rows(out)] == ["run-5", "run-4"]

    _, out, _ = durably_cli(capsys, "runs", str(runs), "--sort", "run", "--limit", "3")
    assert [r[0] for r in table_rows(out)] == ["run-0", "run-1", "run-2"]


def test_runs_names_an_unreadable_run_whatever_the_filter(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unreadable run is a row and an error (exit 1); with ``--phase`` it is still an error."""
    snapshot = runs / "run-2.json"
    snapshot.write_bytes(snapshot.read_bytes()[:40])

    code, out, err = durably_cli(capsys, "runs", str(runs), "--limit", "1")
    assert code == 1
    assert [r[:2] for r in table_rows(out)] == [["run-5", "done"], ["run-2", "unreadable"]]
    assert f"checkpoint {snapshot} is corrupt" in err

    code, out, err = durably_cli(capsys, "runs", str(runs), "--phase", "done")
    assert code == 1
    assert "run-2" not in out
    assert f"checkpoint {snapshot} is corrupt" in err


def test_runs_with_a_warm_index_loads_no_run(
    runs: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second ``durably runs`` over unchanged runs shows the same table without loading any."""
    _, first, _ = durably_cli(capsys, "runs", str(runs))

    def refused(self: object, run_id: str) -> RunState:
        raise AssertionError(f"{run_id} was loaded whole")

    monkeypatch.setattr(JournalStore, "read_sync", refused)
    _, second, _ = durably_cli(capsys, "runs", str(runs))

    assert second == first


def _pending_rows_loading_every_run(directory: Path) -> list[dict[str, object]]:
    """What ``pending --json`` printed before the summaries: questions of every loaded run."""
    from durably.decisions import questions

    store = JournalStore(directory)
    rows: list[dict[str, object]] = []
    for run_id in store.list_runs_sync():
        for q in questions(store.read_sync(run_id)):
            rows.append(
                {
                    "run": q.run_id,
                    "call": q.call_id,
                    "tool": q.tool,
                    "effect": q.effect,
                    "kind": "approval" if q.kind == "approve" else "in doubt",
                    "arguments": q.arguments,
                    "key": q.key,
                    "asked_at": q.asked_at.isoformat(),
                    "started_at": q.started_at.isoformat() if q.started_at else None,
                    "why": q.why,
                    "answers": list(q.answers),
                }
            )
    store.close_sync()
    return rows


def test_pending_shows_the_questions_loading_every_run_shows_from_the_index(
    runs: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``durably pending`` lists the same questions as loading every run did, and with a warm
    index it loads none.
    """
    import json

    expected = _pending_rows_loading_every_run(runs)
    assert [row["call"] for row in expected] == ["c5-0", "c5-1"]
    code, out, _ = durably_cli(capsys, "pending", str(runs), "--json")
    assert code == 0
    assert json.loads(out) == expected

    def refused(self: object, run_id: str) -> RunState:
        raise AssertionError(f"{run_id} was loaded whole")

    monkeypatch.setattr(JournalStore, "read_sync", refused)
    _, again, _ = durably_cli(capsys, "pending", str(runs), "--json")
    assert json.loads(again) == expected
    code, table, _ = durably_cli(capsys, "pending", str(runs))
    assert code == 0
    assert "c5-0" in table
    assert "c5-1" in table


def test_the_console_lists_runs_and_questions_from_the_summaries(
    runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The console's runs and questions pages show every run and question, loading no run
    once the index is warm.
    """
    from starlette.testclient import TestClient

    from durably.console.server import create_app
    from durably.storechoice import StoreChoice

    through_index(runs)

    def refused(self: object, run_id: str) -> RunState:
        raise AssertionError(f"{run_id} was loaded whole")

    monkeypatch.setattr(JournalStore, "read_sync", refused)
    root = "/t/" + "t" * 32 + "/"
    app = create_app(StoreChoice(directory=runs), token="t" * 32)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        page = client.get(root).text
        paused = client.get(root, params={"phase": "paused"}).text
        asked = client.get(f"{root}questions").text
        stamp = client.get(f"{root}runs/run-4", params={"stamp": "1"})  # a poll loads no run
    assert stamp.status_code == 200
    for n in range(6):
        assert f'href="{root}runs/run-{n}"' in page
    assert f'href="{root}runs/run-4"' in paused
    assert f'href="{root}runs/run-0"' not in paused
    assert "<td>2</td></tr>" in paused  # run-4's two waiting questions
    assert "Open questions (2)" in asked
    assert "c5-0" in asked
    assert "c5-1" in asked


def test_the_phase_choices_of_durably_runs_are_the_state_s_phases() -> None:
    """``durably runs --phase`` offers exactly the values of ``Phase``, written out in the CLI."""
    from durably.cli.runs import PHASES
    from durably.state import Phase

    assert list(PHASES) == [str(phase) for phase in Phase]
