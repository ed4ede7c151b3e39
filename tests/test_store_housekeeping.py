"""``durably cancel`` and ``durably prune`` on the file stores, with real processes.

An owner process running an agent is cancelled from another process and stops after
its current save; a paused run is cancelled at once; a cancelled run is never resumed.
A prune takes only finished runs old enough and free, and a prune SIGKILLed at any of
its steps leaves every run whole or gone, the next prune (or a new run of the same
ID) finishing what it left.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

import durably
from _helpers.housekeeping_child import make_store, stepper
from _helpers.patience import stretched
from durably import Agent, Call, Effect, Reply, ScriptedModel, ToolContext, tool
from durably.decisions import AskLater, answer
from durably.state import Phase, RunState, ToolResult, UserMessage, utcnow
from durably.stores import CancelOutcome, Housekeeping
from durably.stores.file import FileStore
from durably.tools import ToolInDoubt

CHILD = Path(__file__).parent / "_helpers" / "housekeeping_child.py"
KINDS = ["file", "journal"]


def durably_command(*args: str) -> subprocess.CompletedProcess[str]:
    """One ``durably`` command in its own process, as an operator runs it."""
    environment = {**os.environ, "COLUMNS": "200"}
    environment.pop("DURABLY_DSN", None)
    return subprocess.run(
        [sys.executable, "-m", "durably", *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=stretched(60),
        check=False,
    )


def child(*args: str) -> subprocess.Popen[str]:
    """Start ``housekeeping_child.py`` with ``args``; talk to it over stdin and stdout."""
    return subprocess.Popen(
        [sys.executable, str(CHILD), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def holder() -> Iterator[list[subprocess.Popen[str]]]:
    """Child processes a test starts, ended (stdin closed, then waited for) afterwards."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        process.communicate(
            timeout=stretched(30)
        )  # closes its stdin: it lets go of the run and ends


def hold(started: list[subprocess.Popen[str]], kind: str, directory: Path, run_id: str) -> None:
    """Have a child process open ``run_id`` and keep it open until the test ends."""
    process = child("hold", kind, str(directory), run_id)
    started.append(process)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready", process.stderr


def world_lines(tmp_path: Path) -> list[list[str]]:
    """The ``step`` calls that acted, in order: [call ID, idempotency key] each."""
    world = tmp_path / "world.txt"
    return [line.split() for line in world.read_text().splitlines()] if world.exists() else []


def world_calls(tmp_path: Path) -> list[str]:
    """The call IDs of the ``step`` calls that acted, in order."""
    return [call for call, _ in world_lines(tmp_path)]


def finished_run(store: FileStore, run_id: str, phase: Phase = Phase.DONE) -> RunState:
    """Save a run of ``phase`` and close it.

    A journal run is compacted once (history folded into a summary), so it ends in
    log generation 2 with saves in it: a new run of its ID, starting at generation 1,
    would be refused for a newer log holding saves if that log were left behind.
    """
    state = RunState(run_id=run_id, task="t", created_at=utcnow(), messages=[UserMessage(text="t")])
    handle = store.create_sync(state)
    for n in range(3):
        state.messages.append(UserMessage(text=f"more {n}"))
        handle.save_sync(state)
    state.summary, state.summarized, state.messages = "folded", 3, state.messages[-1:]
    handle.save_sync(state)
    state.messages.append(UserMessage(text="after the fold"))
    handle.save_sync(state)
    state.phase = phase
    if phase is Phase.DONE:
        state.answer, state.stop_reason = "fine", "answered"
    handle.save_sync(state)
    handle.close_sync()
    return store.read_sync(run_id)


# -- cancel ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_running_owner_stops_after_its_current_save_and_the_run_ends_cancelled(
    tmp_path: Path, kind: str
) -> None:
    """`durably cancel` from another process asks the owner to stop: the call under way
    finishes and its result is saved, then the run is saved as cancelled; no further tool
    call is made, and resuming it is refused rather than started afresh.
    """
    runs = tmp_path / "runs"
    owner = child("run", kind, str(runs), "r1")
    assert owner.stdout is not None
    assert owner.stdout.readline().strip() == "in-tool c2"

    asked = durably_command("cancel", "r1", str(runs))
    assert asked.returncode == 0, asked.stderr
    assert "asked the owner of r1 to stop" in asked.stdout
    assert (runs / "r1.cancel").exists()
    out, err = owner.communicate("go\n", timeout=stretched(60))
    assert owner.returncode == 0, err

    assert json.loads(out) == {"status": "cancelled", "turns": 2, "stop": "cancelled"}
    assert world_calls(tmp_path) == ["c1", "c2"]  # c2 finished its story; c3 never ran
    state = make_store(kind, runs).read_sync("r1")
    assert (state.phase, state.stop_reason, state.markers) == (Phase.CANCELLED, "cancelled", {})
    assert [m.call_id for m in state.messages if isinstance(m, ToolResult)] == ["c1", "c2"]
    assert not (runs / "r1.cancel").exists()  # the request was served

    with pytest.raises(durably.RunCancelled, match="'r1' was cancelled"):
        stepper(make_store(kind, runs), tmp_path / "world.txt").resume_sync("r1")
    assert world_calls(tmp_path) == ["c1", "c2"]
    listed = durably_command("runs", str(runs), "--phase", "cancelled")
    assert listed.returncode == 0, listed.stderr
    assert "r1" in listed.stdout


@pytest.mark.parametrize("kind", KINDS)
def test_a_call_in_doubt_finishes_its_ladder_story_before_the_run_is_cancelled(
    tmp_path: Path, kind: str
) -> None:
    """A cancel that arrives while a keyed call is in doubt (its marker saved) waits for the
    ladder: the call is rerun with its key and its result saved, and only then is the run
    saved as cancelled, with no marker left and no later call made.
    """
    runs = tmp_path / "runs"
    store = make_store(kind, runs)
    keys: list[str] = []

    @tool(effect=Effect.KEYED, key_ttl=timedelta(hours=23))
    async def charge(ctx: ToolContext, n: int) -> str:
        """Charge ``n`` (the service deduplicates by key)."""
        keys.append(ctx.idempotency_key)
        if len(keys) == 1:
            asked = await asyncio.to_thread(durably_command, "cancel", "k1", str(runs))
            assert "asked the owner of k1 to stop" in asked.stdout, asked.stderr
            raise ToolInDoubt("the connection dropped after the request was sent")
        return f"charged {n}"

    model = ScriptedModel(
        [Reply(calls=[Call(id=f"c{n}", name="charge", arguments=f'{{"n": {n}}}')]) for n in (1, 2)]
    )
    outcome = Agent(model=model, tools=[charge], store=store).run_sync("charge", run_id="k1")

    assert outcome.status == "cancelled"
    assert keys == [keys[0], keys[0]]  # c1 rerun with its key; c2 never asked
    state = store.read_sync("k1")
    assert (state.phase, state.markers) == (Phase.CANCELLED, {})
    assert [m.call_id for m in state.messages if isinstance(m, ToolResult)] == ["c1"]
    assert state.resolutions["c1"].outcome == "rerun"


@pytest.mark.parametrize("kind", KINDS)
def test_a_cancel_left_for_an_owner_that_died_mid_call_waits_for_that_calls_ladder(
    tmp_path: Path, kind: str
) -> None:
    """An owner SIGKILLed inside a keyed call after `durably cancel` asked it to stop: the
    next owner's restart save (the call's marker still saved) does not cancel; the call is
    rerun with its key and its result saved, then the run ends cancelled, no later call made.
    """
    runs = tmp_path / "runs"
    owner = child("run", kind, str(runs), "r1")
    assert owner.stdout is not None
    assert owner.stdout.readline().strip() == "in-tool c2"
    asked = durably_command("cancel", "r1", str(runs))
    assert "asked the owner of r1 to stop" in asked.stdout, asked.stderr
    owner.kill()
    owner.communicate(timeout=stretched(30))
    assert owner.returncode == -signal.SIGKILL
    assert "c2" in make_store(kind, runs).read_sync("r1").markers

    outcome = stepper(make_store(kind, runs), tmp_path / "world.txt", wait_at=None).resume_sync(
        "r1"
    )

    assert outcome.status == "cancelled"
    assert world_calls(tmp_path) == ["c1", "c2", "c2"]  # c2 rerun with its key, c3 never
    assert world_lines(tmp_path)[1] == world_lines(tmp_path)[2]
    state = make_store(kind, runs).read_sync("r1")
    assert (state.phase, state.markers, state.resumes) == (Phase.CANCELLED, {}, 1)
    assert [m.call_id for m in state.messages if isinstance(m, ToolResult)] == ["c1", "c2"]


def approval_agent(store: FileStore) -> Agent:
    """An agent whose one call waits for a person's approval."""

    @tool(effect=Effect.WRITE, needs_approval=True)
    async def refund(ctx: ToolContext, order_id: str) -> str:
        """Refund an order."""
        raise AssertionError("a cancelled run's call must never run")

    model = ScriptedModel(
        [Reply(calls=[Call(id="c1", name="refund", arguments='{"order_id": "1042"}')])]
    )
    return Agent(model=model, tools=[refund], store=store, approver=AskLater())


@pytest.mark.parametrize("kind", KINDS)
def test_a_paused_run_is_cancelled_at_once_and_never_asks_again(tmp_path: Path, kind: str) -> None:
    """A run nobody holds (paused for a person) is saved as cancelled by `durably cancel`
    itself: its question is gone, an answer is refused, a resume is refused.
    """
    runs = tmp_path / "runs"
    store = make_store(kind, runs)
    assert approval_agent(store).run_sync("refund 1042", run_id="p1").status == "paused"

    cancelled = durably_command("cancel", "p1", str(runs))
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith("cancelled p1: nobody held it")

    state = store.read_sync("p1")
    assert (state.phase, state.stop_reason, state.pending) == (
        Phase.CANCELLED,
        "cancelled",
        {},
    )
    pending = durably_command("pending", str(runs))
    assert "no open questions" in pending.stdout
    with pytest.raises(durably.AnswerRefused, match="cancelled"):
        asyncio.run(answer(store, run_id="p1", call_id="c1", decision=durably.Yes()))
    with pytest.raises(durably.RunCancelled):
        approval_agent(store).resume_sync("p1")
    again = durably_command("cancel", "p1", str(runs))
    assert again.stdout.startswith("p1 was already finished (cancelled)")


def test_cancel_of_a_finished_or_missing_run_changes_nothing(tmp_path: Path) -> None:
    """A done run stays done (``finished``); a run that does not exist is an error naming it."""
    store = FileStore(tmp_path / "runs")
    finished_run(store, "d1")
    assert asyncio.run(store.cancel("d1")) is CancelOutcome.FINISHED
    assert store.read_sync("d1").phase is Phase.DONE
    missing = durably_command("cancel", "nope", str(tmp_path / "runs"))
    assert missing.returncode == 1
    assert "no run 'nope'" in missing.stderr


def test_the_file_stores_offer_housekeeping(tmp_path: Path) -> None:
    """FileStore, JournalStore and the CLI's DirectoryStore are ``Housekeeping`` stores."""
    from durably.stores.directory import DirectoryStore

    for store in (
        FileStore(tmp_path),
        durably.JournalStore(tmp_path),
        DirectoryStore(tmp_path),
    ):
        assert isinstance(store, Housekeeping)


# -- prune -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_prune_takes_only_finished_runs_old_enough_and_free(
    tmp_path: Path, kind: str, holder: list[subprocess.Popen[str]]
) -> None:
    """Prune never touches a run that is not finished, nor one a process holds (reported as
    owned), nor one saved after the cutoff; what it takes is gone with every file it had.
    """
    runs = tmp_path / "runs"
    store = make_store(kind, runs)
    for run_id in ("done-1", "done-held"):
        finished_run(store, run_id)
    finished_run(store, "cancelled-1", Phase.CANCELLED)
    for run_id, phase in (("paused-1", Phase.PAUSED), ("model-1", Phase.MODEL)):
        finished_run(store, run_id, phase)
    hold(holder, kind, runs, "done-held")
    saved = store.read_sync("done-1").saved_at
    assert saved is not None

    young = asyncio.run(store.prune(older_than=timedelta(days=30), now=saved + timedelta(days=29)))
    assert (young.pruned, young.owned) == ((), ())
    report = asyncio.run(store.prune(older_than=timedelta(days=30), now=saved + timedelta(days=31)))

    assert report.pruned == ("cancelled-1", "done-1")
    assert report.owned == ("done-held",)
    assert store.list_runs_sync() == ["done-held", "model-1", "paused-1"]
    left = sorted(os.listdir(runs))
    assert not [name for name in left if name.startswith(("done-1.", "cancelled-1.", "."))]
    for run_id in ("model-1", "paused-1", "done-held"):
        assert store.read_sync(run_id).run_id == run_id
    for run_id in ("done-1", "cancelled-1"):
        with pytest.raises(durably.RunNotFound):
            store.open_sync(run_id)


# -- a kill mid-prune ----------------------------------------------------------------------

PRUNE_STEPS = [
    "store.prune.locked",
    "store.prune.renamed",
    "store.prune.dir_synced",
    "store.prune.log_removed",
    "store.prune.files_removed",
    "store.prune.lock_removed",
    "store.prune.tombstone_removed",
]
"""Every crash point of a prune, in order (a snapshot run has no log to remove)."""


def kill_mid_prune(runs: Path, kind: str, label: str) -> None:
    """Run a prune in a child process that SIGKILLs itself at ``label``."""
    pruner = child("prune", kind, str(runs), "-", label)
    out, err = pruner.communicate(timeout=stretched(60))
    assert pruner.returncode == -signal.SIGKILL, (out, err)


def files_of(runs: Path, run_id: str) -> list[str]:
    """The files of ``run_id`` in ``runs``: its own, its temp files and its tombstone."""
    return sorted(
        name
        for name in os.listdir(runs)
        if name.startswith((f"{run_id}.", f".{run_id}."))
        and not name.startswith((f"{run_id}.{run_id}", f".{run_id}.{run_id}"))
    )


def whole_or_gone(store: FileStore, run_id: str, before: RunState, *, open_it: bool) -> bool:
    """Check ``run_id`` is whole (listed, reads as it was) or gone (unlisted, cannot be read).

    ``open_it``: open it too (a whole run opens as it was; a gone one is not found,
    and that open finishes what a killed prune left of it). Returns True when whole.
    """
    if run_id in store.list_runs_sync():
        assert store.read_sync(run_id) == before
        if open_it:
            handle, state = store.open_sync(run_id)
            handle.close_sync()
            assert state == before
        return True
    with pytest.raises(durably.RunNotFound):
        store.read_sync(run_id)
    if open_it:
        with pytest.raises(durably.RunNotFound):
            store.open_sync(run_id)
        assert files_of(store.directory, run_id) == []
    return False


@pytest.mark.parametrize("then", ["prune", "open", "create"])
@pytest.mark.parametrize(
    ("kind", "label"),
    [
        (kind, label)
        for kind in KINDS
        for label in [*PRUNE_STEPS, "store.prune.locked@2", "store.prune.renamed@2"]
        if not (kind == "file" and label == "store.prune.log_removed")  # a snapshot has no log
    ],
)
def test_a_prune_killed_at_any_step_leaves_each_run_whole_or_gone(
    tmp_path: Path, kind: str, label: str, then: str
) -> None:
    """A prune SIGKILLed at any of its steps leaves every run whole (it reads and opens as it
    was) or gone (not listed, cannot be read or opened); the next prune, an open of a pruned
    run's ID or a new run of it finishes what it left, and a new run never meets an old log.
    """
    runs = tmp_path / "runs"
    store = make_store(kind, runs)
    before = {run_id: finished_run(store, run_id) for run_id in ("a", "b")}
    before["w"] = finished_run(store, "w", Phase.PAUSED)
    assert (runs / "a.2.log").exists() == (kind == "journal")

    kill_mid_prune(runs, kind, label)

    a_whole = label == "store.prune.locked"  # whole only if killed before its commit point
    if then == "create":  # the ID used again at once, by a new run
        fresh = RunState(
            run_id="a", task="again", created_at=utcnow(), messages=[UserMessage(text="again")]
        )
        if a_whole:
            with pytest.raises(durably.RunExists):
                store.create_sync(fresh)
        else:
            handle = store.create_sync(fresh)
            for n in range(3):
                fresh.messages.append(UserMessage(text=f"new {n}"))
                handle.save_sync(fresh)
            handle.close_sync()
            handle, state = store.open_sync("a")
            handle.close_sync()
            texts = [m.text for m in state.messages if isinstance(m, UserMessage)]
            assert texts == ["again", "new 0", "new 1", "new 2"]
            assert ".a.pruned" not in os.listdir(runs)
            del before["a"]
    whole = {
        run_id: whole_or_gone(store, run_id, state, open_it=then != "prune")
        for run_id, state in before.items()
    }
    assert whole["w"]  # never finished: never touched
    assert whole.get("a", a_whole) == a_whole
    # Killed among a's steps, or at b's lock, b is whole; once b is renamed, gone.
    assert whole["b"] == (label != "store.prune.renamed@2")
    if then == "prune":
        report = store.prune_sync(timedelta(0), utcnow() + timedelta(days=1))
        assert set(report.pruned) == {run_id for run_id in ("a", "b") if whole[run_id]}
        assert files_of(runs, "a") == files_of(runs, "b") == []
        assert [name for name in os.listdir(runs) if name.startswith(".")] == []
        assert store.list_runs_sync() == ["w"]


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
@pytest.mark.parametrize("call", ["renameat", "unlinkat", "fsync"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_prune_killed_at_every_rename_unlink_and_fsync_leaves_each_run_whole_or_gone(
    tmp_path: Path, kind: str, call: str
) -> None:
    """The pruning process is SIGKILLed (by strace) as it enters its Nth ``call``, N from 1 until a
    prune finishes unkilled: after every kill each run is whole or gone, and the next prune
    leaves nothing of the pruned runs behind (instants no crash point names).
    """
    environment = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    kills = 0
    for n in range(1, 50):
        runs = tmp_path / f"n{n}" / "runs"
        store = make_store(kind, runs)
        before = {run_id: finished_run(store, run_id) for run_id in ("a", "b")}
        before["w"] = finished_run(store, "w", Phase.PAUSED)
        inject = f"inject={call}:signal=KILL:when={n}"
        pruner = subprocess.run(
            [
                *("strace", "-f", "-qq", "-o", "/dev/null", "-e", f"trace={call}", "-e", inject),
                *(sys.executable, str(CHILD), "prune", kind, str(runs), "-", ""),
            ],
            env=environment,
            capture_output=True,
            text=True,
            timeout=stretched(60),
            check=False,
        )
        if pruner.returncode == 0:
            assert json.loads(pruner.stdout)["pruned"] == ["a", "b"]
            break
        assert pruner.returncode == -signal.SIGKILL, pruner.stderr
        kills += 1
        whole = {
            run_id: whole_or_gone(store, run_id, state, open_it=False)
            for run_id, state in before.items()
        }
        assert whole["w"]
        report = store.prune_sync(timedelta(0), utcnow() + timedelta(days=1))
        assert set(report.pruned) == {run_id for run_id in ("a", "b") if whole[run_id]}
        assert files_of(runs, "a") == files_of(runs, "b") == []
        assert [name for name in os.listdir(runs) if name.startswith(".")] == []
        assert store.read_sync("w") == before["w"]
    else:
        pytest.fail(f"the prune never finished unkilled at {call}")
    assert kills >= 2  # at least one kill for each of the two runs
