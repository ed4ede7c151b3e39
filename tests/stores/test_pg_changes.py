"""The Postgres store saves changes: a snapshot now and then, and each save's change as a row."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import msgspec
import psycopg
import pytest
from _pg_sql import run, sql

import durably
from _helpers.patience import stretched
from _helpers.samples import state_a
from durably._exit import EXIT
from durably.cli import main
from durably.postgres import PostgresStore, _sql, claim, enqueue
from durably.postgres import store as postgres
from durably.state import AssistantMessage, RunState, ToolResult, UserMessage

pytestmark = pytest.mark.postgres


def step(state: RunState, n: int, *, size: int = 40) -> None:
    """One turn of a run: a reply, a tool's result, and the fields a turn changes."""
    state.messages.append(AssistantMessage(text=f"turn {n}", turn=n))
    state.messages.append(ToolResult(call_id=f"c{n}", name="grep", content="x" * size))
    state.turns = n
    state.workspace[f"file_{n}.py"] = f"{n:064x}"
    state.workspace.pop(f"file_{n - 1}.py", None)


def rows(dsn: str, run_id: str = "r1") -> tuple[tuple[int, int], list[int]]:
    """The run's (state_seq, seq), and the save numbers of its changes."""
    numbers = sql(dsn, "SELECT state_seq, seq FROM durably_runs WHERE run_id = %s", run_id)
    changes = sql(dsn, "SELECT seq FROM durably_changes WHERE run_id = %s ORDER BY seq", run_id)
    return numbers[0], [seq for (seq,) in changes]


def test_a_save_writes_its_change_and_leaves_the_snapshot(pg_dsn: str) -> None:
    """Each save adds one small row; the state column keeps the first snapshot's bytes; every
    save reads back whole, through ``read`` and through ``open``.
    """
    state = state_a("r1")

    async def scenario(store: PostgresStore) -> None:
        handle = await store.create(state)
        first = sql(pg_dsn, "SELECT state FROM durably_runs")
        for n in range(1, 6):
            step(state, n, size=2000)
            await handle.save(state)
            assert await store.read("r1") == state
        assert store.stats.snapshots == 0
        assert sql(pg_dsn, "SELECT state FROM durably_runs") == first
        await handle.close()
        again, loaded = await store.open("r1")
        assert loaded == state
        step(state, 6)
        await again.save(state)  # an opened handle goes on with changes
        assert store.stats.snapshots == 0
        await again.close()

    run(pg_dsn, scenario)
    assert rows(pg_dsn) == ((0, 6), [1, 2, 3, 4, 5, 6])
    sizes = sql(pg_dsn, "SELECT max(length(change)) FROM durably_changes")[0][0]
    assert sizes < 2600, "a change holds the turn, not the state"


def test_a_rewritten_history_saves_a_snapshot_and_drops_the_changes(pg_dsn: str) -> None:
    """A summary (messages no longer continuing the saved ones) is a new snapshot: the run's
    changes are deleted in the same statement, and the next save is a change again.
    """
    state = state_a("r1")

    async def scenario(store: PostgresStore) -> None:
        handle = await store.create(state)
        for n in range(1, 4):
            step(state, n)
            await handle.save(state)
        state.messages = [UserMessage(text="summary of turns 1-3")]
        state.summarized += 1
        await handle.save(state)
        assert store.stats.snapshots == 1
        assert rows(pg_dsn) == ((4, 4), [])
        assert await store.read("r1") == state
        step(state, 4)
        await handle.save(state)
        assert await store.read("r1") == state
        await handle.close()

    run(pg_dsn, scenario)
    assert rows(pg_dsn) == ((4, 5), [5])


def test_changes_that_outgrow_the_snapshot_are_folded_into_a_new_one(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the changes since the snapshot hold more bytes than it, the next save writes a
    snapshot, so a read never replays more than about a snapshot's worth of changes
    (with the ratio at 1: the default policy waits for four snapshots' worth and 1 MB).
    """
    monkeypatch.setattr(postgres, "_SNAPSHOT_MIN_BYTES", 0)
    monkeypatch.setattr(postgres, "_SNAPSHOT_RATIO", 1.0)
    state = state_a("r1")

    async def scenario(store: PostgresStore) -> None:
        handle = await store.create(state)
        for n in range(1, 30):
            step(state, n, size=300)
            await handle.save(state)
            assert await store.read("r1") == state
            (state_seq, seq), changes = rows(pg_dsn)
            assert changes == list(range(state_seq + 1, seq + 1))
            snapshot = sql(pg_dsn, "SELECT length(state) FROM durably_runs")[0][0]
            held = sql(pg_dsn, "SELECT coalesce(sum(length(change)), 0) FROM durably_changes")
            assert held[0][0] <= snapshot + 2 * 400  # at most one change past the snapshot's size
        assert store.stats.snapshots >= 3
        await handle.close()

    run(pg_dsn, scenario)


def test_a_run_growing_to_160_kb_writes_its_state_once(pg_dsn: str) -> None:
    """A run whose state grows to about 160 KB by appends saves only changes after its first
    snapshot (the journal store's policy: a snapshot once the changes outgrow four
    snapshots and 1 MB), so the WAL holds each byte of the state about once.
    """
    state = state_a("r1")

    async def scenario(store: PostgresStore) -> None:
        handle = await store.create(state)
        for n in range(1, 61):
            step(state, n, size=2700)
            await handle.save(state)
        assert store.stats.snapshots == 0
        held = sql(pg_dsn, "SELECT sum(length(change)) FROM durably_changes")[0][0]
        assert held > 160_000
        assert await store.read("r1") == state
        await handle.close()

    run(pg_dsn, scenario)


def test_a_claimed_run_saves_a_snapshot_first_then_changes(pg_dsn: str) -> None:
    """A worker's handle has not seen the row: its first save is a snapshot, then changes; the
    next claim loads the snapshot and the changes.
    """
    state = state_a("q1")

    async def scenario(store: PostgresStore) -> None:
        await enqueue(store, run_id="q1", agent="ledger", task=state.task)
        (first,) = await claim(store, agents=["ledger"], limit=1)
        assert first.load() is None
        await first.handle.save(state)
        assert store.stats.snapshots == 1
        for n in range(1, 3):
            step(state, n)
            await first.handle.save(state)
        assert store.stats.snapshots == 1
        await first.handle.close()
        (second,) = await claim(store, agents=["ledger"], limit=1)
        assert second.load() == state
        step(state, 3)
        await second.handle.save(state)
        assert store.stats.snapshots == 2
        assert await store.read("q1") == state
        await second.handle.close()

    run(pg_dsn, scenario)
    assert rows(pg_dsn, "q1") == ((4, 4), [])


def test_a_change_sent_again_after_it_landed_adds_nothing(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save's statement sent a second time (as a retry does when the first reply was lost)
    lands again without a second row, and the run reads as saved once.
    """
    sent: list[list[dict[str, Any]]] = []
    real = _sql.saving  # the statement builder, watched

    def watched(
        saves: list[dict[str, Any]],
    ) -> Callable[[psycopg.AsyncConnection[tuple[Any, ...]]], Awaitable[_sql.Landed]]:
        sent.append(saves)
        return real(saves)

    monkeypatch.setattr(_sql, "saving", watched)
    state = state_a("r1")

    async def scenario(store: PostgresStore) -> None:
        handle = await store.create(state)
        step(state, 1)
        await handle.save(state)
        (last,) = sent[-1]
        assert last["change"] is not None
        assert await store.execute(real([last]), what="saving again") == {"r1": False}
        assert await store.read("r1") == state
        step(state, 2)
        await handle.save(state)
        assert await store.read("r1") == state
        await handle.close()

    run(pg_dsn, scenario)
    assert rows(pg_dsn) == ((0, 2), [1, 2])


def saved_with_changes(dsn: str, run_id: str = "r1") -> RunState:
    """The run saved as a snapshot and three changes, closed; its state."""
    state = state_a(run_id)

    async def scenario(store: PostgresStore) -> None:
        handle = await store.create(state)
        for n in range(1, 4):
            step(state, n)
            await handle.save(state)
        await handle.close()

    run(dsn, scenario)
    assert rows(dsn, run_id) == ((0, 3), [1, 2, 3])
    return state


def refused(dsn: str, match: str) -> None:
    """Opening and reading r1 are CheckpointCorrupt matching ``match``; the rows stay as found."""
    changes = "SELECT seq, change FROM durably_changes WHERE run_id = 'r1' ORDER BY seq"
    runs = "SELECT state, state_seq, seq FROM durably_runs WHERE run_id = 'r1'"
    before = sql(dsn, changes), sql(dsn, runs)

    async def scenario(store: PostgresStore) -> None:
        with pytest.raises(durably.CheckpointCorrupt, match=match) as opened:
            await store.open("r1")
        assert "durably_runs['r1']" in str(opened.value)
        with pytest.raises(durably.CheckpointCorrupt, match=match):
            await store.read("r1")

    run(dsn, scenario)
    assert (sql(dsn, changes), sql(dsn, runs)) == before


@pytest.mark.parametrize("lost", [1, 2, 3])
def test_a_deleted_change_is_corrupt_never_skipped(pg_dsn: str, lost: int) -> None:
    """A missing change, first, middle or last, refuses the run instead of loading less."""
    saved_with_changes(pg_dsn)
    sql(pg_dsn, "DELETE FROM durably_changes WHERE seq = %s", lost)
    refused(pg_dsn, "holds the change of save" if lost < 3 else "rows of durably_changes")


def test_a_change_moved_from_another_run_is_corrupt(pg_dsn: str) -> None:
    """A change row of another run put in this run's place is refused: records name their run."""
    saved_with_changes(pg_dsn)
    saved_with_changes(pg_dsn, "r2")
    sql(
        pg_dsn,
        "UPDATE durably_changes AS c SET change = o.change FROM durably_changes AS o "
        "WHERE c.run_id = 'r1' AND o.run_id = 'r2' AND c.seq = 2 AND o.seq = 2",
    )
    refused(pg_dsn, "of run 'r2'")


def test_a_damaged_change_is_corrupt(pg_dsn: str) -> None:
    """A change row that is not a record is refused, naming the row."""
    saved_with_changes(pg_dsn)
    sql(pg_dsn, "UPDATE durably_changes SET change = 'not json' WHERE seq = 2")
    refused(pg_dsn, r"durably_changes\['r1', 2\]")


def test_an_older_snapshot_put_back_under_newer_changes_is_corrupt(pg_dsn: str) -> None:
    """The snapshot names its save number in its checksum: a state column replaced by another
    snapshot (an older backup of the row) is refused, not continued with changes it never had.
    """
    state = state_a("r1")

    async def scenario(store: PostgresStore) -> None:
        handle = await store.create(state)
        step(state, 1)
        await handle.save(state)
        state.messages = [UserMessage(text="summary")]
        state.summarized += 1
        await handle.save(state)  # snapshot of save 2
        step(state, 3)
        await handle.save(state)  # snapshot of save 3 (the history was rewritten)
        step(state, 4)
        await handle.save(state)
        await handle.close()

    async def keep(store: PostgresStore) -> None:
        await (await store.create(state_a("r1"))).close()

    run(pg_dsn, keep)
    older = sql(pg_dsn, "SELECT state FROM durably_runs")
    sql(pg_dsn, "DELETE FROM durably_runs")
    run(pg_dsn, scenario)
    assert rows(pg_dsn) == ((2, 4), [3, 4])
    sql(pg_dsn, "UPDATE durably_runs SET state = %s", older[0][0])
    refused(pg_dsn, "snapshot of save 0 and the row says")


def test_a_save_number_moved_behind_the_handles_back_refuses_its_save(pg_dsn: str) -> None:
    """The save goes only onto the row the handle last wrote: a row whose ``seq`` moved (an
    edit by hand, a restored backup) refuses the save, and nothing is written.
    """
    state = state_a("r1")

    async def scenario(store: PostgresStore) -> None:
        handle = await store.create(state)
        step(state, 1)
        await handle.save(state)
        sql(pg_dsn, "UPDATE durably_runs SET seq = 7")
        step(state, 2)
        with pytest.raises(durably.LeaseLost):
            await handle.save(state)
        await handle.close()

    run(pg_dsn, scenario)
    assert rows(pg_dsn) == ((0, 7), [1])


def test_durably_show_reads_a_postgres_run_with_its_changes(
    pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``durably show RUN --dsn`` prints the state a run's snapshot and changes make, the run
    named by the start of its ID as for a directory.
    """
    state = saved_with_changes(pg_dsn)
    printed = []
    for args in (["r", "--json"], ["r1"]):
        with pytest.raises(SystemExit) as exited:
            main(["show", *args, "--dsn", pg_dsn])
        assert exited.value.code == 0
        printed.append(capsys.readouterr().out)
    assert msgspec.json.decode(printed[0], type=RunState) == state
    assert [line.split() for line in printed[1].splitlines() if line.startswith("turns")] == [
        ["turns", "3"]
    ]


def test_a_group_statement_carries_changes_and_snapshots_together(pg_dsn: str) -> None:
    """Saves that wait for a place in flight go in one statement, changes and snapshots mixed:
    each run's rows end as its lone save's would.
    """
    names = ["r1", "r2", "r3", "r4", "r5"]
    states = {run_id: state_a(run_id) for run_id in names}

    async def scenario(store: PostgresStore) -> None:
        handles = [await store.create(states[run_id]) for run_id in names]
        for state in states.values():
            step(state, 1)
        for run_id in ("r4", "r5"):  # the last two in the group: new snapshots
            states[run_id].messages = [UserMessage(text="summary")]
            states[run_id].summarized += 1
        await asyncio.gather(*(h.save(states[h.run_id]) for h in handles))
        assert store.stats.grouped == 3, "r3, r4 and r5 were meant to share one statement"
        assert store.stats.snapshots == 2
        for run_id in names:
            assert await store.read(run_id) == states[run_id]
        for handle in handles:
            await handle.close()

    run(pg_dsn, scenario)
    assert [rows(pg_dsn, run_id) for run_id in names] == [((0, 1), [1])] * 3 + [((1, 1), [])] * 2


def slow_change_saves(monkeypatch: pytest.MonkeyPatch, pause: float) -> None:
    """From now on a lone change save holds the row's lock ``pause`` seconds after its UPDATE."""
    slow = _sql.SAVE_CHANGE.replace(  # the lone change save, slowed down
        "SELECT run_id, cancel FROM saved", "SELECT run_id, cancel, pg_sleep(%(pause)s) FROM saved"
    )
    assert slow != _sql.SAVE_CHANGE
    monkeypatch.setattr(_sql, "SAVE_CHANGE", slow)
    real = _sql.saving  # the statement builder, given the pause

    def paused(saves: list[dict[str, Any]]) -> Any:
        return real([{**saves[0], "pause": pause}])

    monkeypatch.setattr(_sql, "saving", paused)


def test_a_takeover_waiting_for_a_save_in_flight_loads_that_save(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save that began while its lease was live lands even if the lease runs out meanwhile;
    a takeover that waited for it on the row lock loads it, change and all (no false
    CheckpointCorrupt from reading the row after the save and its changes from before).
    """
    state = state_a("r1")

    async def scenario() -> RunState:
        async with (
            PostgresStore(pg_dsn, lease=timedelta(seconds=1)) as old,
            PostgresStore(pg_dsn, lease=timedelta(seconds=30)) as new,
        ):
            handle = await old.create(state)
            handle.keeper.renewal.cancel()  # the owner stalls: its lease will run out
            step(state, 1)
            await handle.save(state)
            step(state, 2)
            # The save holds the row's lock for a while after its UPDATE, before it commits.
            slow_change_saves(monkeypatch, 1.2)
            saving = asyncio.create_task(handle.save(state))  # lease live: it begins
            await asyncio.sleep(1.1)  # the lease has run out; the save still holds the row
            taking, loaded = await new.open("r1")  # waits for the save's commit
            await saving
            await taking.close()
            return loaded

    assert asyncio.run(scenario()) == state
    assert rows(pg_dsn) == ((0, 2), [1, 2])


def test_a_claim_passes_by_a_run_whose_save_is_in_flight_then_loads_that_save(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker polling while a stalled owner's save still holds the row skips the run (``SKIP
    LOCKED``), though its lease has run out; its next poll, after that save committed, claims
    the run and loads the save, change and all.
    """
    state = state_a("q1")

    async def scenario() -> tuple[list[str], RunState | None]:
        async with (
            PostgresStore(pg_dsn, lease=timedelta(seconds=1)) as old,
            PostgresStore(pg_dsn, lease=timedelta(seconds=30)) as new,
        ):
            await enqueue(old, run_id="q1", agent="ledger", task=state.task)
            (first,) = await claim(old, agents=["ledger"], limit=1)
            handle = first.handle
            handle.keeper.renewal.cancel()  # the owner stalls: its lease will run out
            await handle.save(state)  # a claimed handle's first save: a snapshot
            step(state, 1)
            await handle.save(state)
            step(state, 2)
            slow_change_saves(monkeypatch, 2.5)
            saving = asyncio.create_task(handle.save(state))  # lease live: it begins
            await asyncio.sleep(1.4)  # the lease has run out; the save still holds the row
            during = [c.run_id for c in await claim(new, agents=["ledger"], limit=1)]
            await saving
            (after,) = await claim(new, agents=["ledger"], limit=1)
            loaded = after.load()
            await after.handle.close()
            return during, loaded

    during, loaded = asyncio.run(scenario())
    assert during == []
    assert loaded == state
    assert rows(pg_dsn, "q1") == ((1, 3), [2, 3])  # the snapshot, then the two changes


def test_durably_runs_lists_a_postgres_store(
    pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``durably runs --dsn`` shows each run from its summary columns, which its saves wrote,
    never reading a state (issue 38): a run whose changes were damaged since is listed as
    saved; ``durably show`` reads it whole, names the damage on stderr, and fails.
    """
    saved_with_changes(pg_dsn, "r1")
    saved_with_changes(pg_dsn, "r2")
    saved_with_changes(pg_dsn, "r3")
    sql(pg_dsn, "UPDATE durably_changes SET change = 'not json' WHERE run_id = 'r3' AND seq = 2")
    with pytest.raises(SystemExit) as exited:
        main(["runs", "--dsn", pg_dsn, "--sort", "run"])
    out, err = capsys.readouterr()
    assert exited.value.code == EXIT["done"], err
    table = [line.split("│")[1:-1] for line in out.splitlines() if line.startswith("│")]
    cells = [[cell.strip() for cell in row] for row in table]
    assert [(row[0], row[1], row[5]) for row in cells] == [
        ("r1", "model", "3"),
        ("r2", "model", "3"),
        ("r3", "model", "3"),
    ]
    with pytest.raises(SystemExit) as exited:
        main(["show", "r3", "--dsn", pg_dsn])
    out, err = capsys.readouterr()
    assert exited.value.code != EXIT["done"]
    assert "durably_changes['r3', 2]" in err


def test_changes_past_the_rows_last_save_are_corrupt(pg_dsn: str) -> None:
    """A row older than its changes (the two tables restored from different times) is refused,
    never loaded with changes the row does not count.
    """
    saved_with_changes(pg_dsn)
    sql(pg_dsn, "UPDATE durably_runs SET seq = 2")
    refused(pg_dsn, "past the row's last save 2")


SAVE_SETS = {"phase", "saved_at", "parked", "seq", "turns", "dollars", "resumes"}
"""The columns of ``durably_runs`` a change save sets (``_sql.SAVE_CHANGE``)."""


def test_no_index_of_the_runs_table_names_a_column_a_change_save_sets(pg_dsn: str) -> None:
    """A key or predicate naming one of them makes every save a new row version in each index."""

    async def scenario(store: PostgresStore) -> None:
        await store.migrate()

    run(pg_dsn, scenario)
    named = sql(
        pg_dsn,
        """SELECT i.indexrelid::regclass::text, a.attname FROM pg_index AS i
        JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum > 0
        WHERE i.indrelid = 'durably_runs'::regclass
          AND (a.attnum = ANY(i.indkey)
               OR pg_get_expr(i.indpred, i.indrelid) ~ ('\\m' || a.attname || '\\M'))""",
    )
    assert named, "the query finds the columns indexes name"
    assert [(index, column) for index, column in named if column in SAVE_SETS] == []


def test_change_saves_update_the_runs_row_in_place(pg_dsn: str) -> None:
    """Saves moving ``phase`` between model and tools are heap-only (HOT) updates, as the
    server's own statistics count them once the store's connections have closed.
    """
    state = state_a("r1")

    async def scenario(store: PostgresStore) -> None:
        handle = await store.create(state)
        for n in range(1, 21):
            step(state, n)
            state.phase = durably.Phase.TOOLS if n % 2 else durably.Phase.MODEL
            await handle.save(state)
        await handle.close()

    run(pg_dsn, scenario)
    counts = (0, 0)
    deadline = time.monotonic() + stretched(20)
    while time.monotonic() < deadline:  # a backend's statistics land when it exits
        counts = sql(
            pg_dsn,
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
            " WHERE relid = 'durably_runs'::regclass",
        )[0]
        if counts[0] >= 20:
            break
        time.sleep(0.2)
    updates, hot = counts
    assert updates >= 20, f"the statistics never counted the saves: {counts}"
    assert hot >= 0.9 * updates, f"{hot} of {updates} updates were heap-only"
