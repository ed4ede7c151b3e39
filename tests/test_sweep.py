"""The crash sweep: the reference triage table, and a second job built from the public API."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from types import MappingProxyType

import pytest
from typing_extensions import override

import durably
from _helpers.patience import stretched
from durably import Effect, ToolContext, tool
from durably.sweep import (
    CONFIGS,
    Config,
    SweepReport,
    World,
    assert_clean,
    digest_files,
    pool,
    run_sweep,
    scratch_root,
)
from durably.sweep.powerloss import run_power_loss_sweep
from durably.sweep.tree import Tree, Uncopyable

REFERENCE = Path(__file__).parent / "testdata" / "sweep.txt"


# -- a second job: refunds against a ledger that honours keys (or not) -------------------


class Ledger:
    """A payment service: one JSON line per refund it performed; dedups on keys if asked."""

    def __init__(self, path: Path, *, honour_keys: bool) -> None:
        self.path = path
        self.honour_keys = honour_keys

    def entries(self) -> list[dict[str, object]]:
        """Every refund in the ledger, in order."""
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines()]

    def refund(self, *, order: str, cents: int, key: str) -> str:
        """Make a refund, or with keys honoured, give the one made with ``key`` again."""
        if self.honour_keys:
            for entry in self.entries():
                if entry["key"] == key:
                    return f"refund {entry['id']} (replayed)"
        number = len(self.entries()) + 1
        with self.path.open("a") as out:
            out.write(json.dumps({"id": number, "order": order, "cents": cents, "key": key}))
            out.write("\n")
        return f"refund {number}"


class RefundJob:
    """Refund two orders and email the customer: a keyed call, a write with a lookup."""

    name = "refunds"

    def prepare(self, world: World) -> None:
        """Make the outbox the email tool writes to."""
        (world.root / "mail").mkdir()

    def task(self) -> str:
        """The task the agent is given."""
        return "refund orders 1042 and 1043 and tell the customer"

    def _ledger(self, world: World) -> Ledger:
        return Ledger(world.root / "ledger.jsonl", honour_keys=world.config.honour_keys)

    def agent(self, world: World, approver: durably.Approver) -> durably.Agent:
        """The refund agent: a keyed refund with a lookup, and an email."""
        ledger = self._ledger(world)
        outbox = world.root / "mail"

        async def find_refund(ctx: ToolContext, order: str, cents: int) -> durably.Lookup:
            for entry in ledger.entries():
                if entry["key"] == ctx.idempotency_key:
                    return durably.Found(f"refund {entry['id']}")
            return durably.NOT_FOUND

        # Declared honestly: keyed only where the ledger deduplicates on keys.
        honoured = world.config.honour_keys

        @tool(
            effect=Effect.KEYED if honoured else Effect.WRITE,
            key_ttl=timedelta(hours=24) if honoured else None,
            needs_approval=True,
            lookup=find_refund,
        )
        async def refund(ctx: ToolContext, order: str, cents: int) -> str:
            """Refund an order."""
            return ledger.refund(order=order, cents=cents, key=ctx.idempotency_key)

        async def find_email(ctx: ToolContext, to: str, text: str) -> durably.Lookup:
            sent = outbox / f"{ctx.idempotency_key}.txt"
            return durably.Found(f"sent to {to}") if sent.exists() else durably.NOT_FOUND

        @tool(effect=Effect.WRITE, lookup=find_email)
        async def send_email(ctx: ToolContext, to: str, text: str) -> str:
            """Email a customer."""
            (outbox / f"{ctx.idempotency_key}.txt").write_text(text)
            return f"sent to {to}"

        model = durably.ScriptedModel(
            [
                durably.Reply(
                    text="Refunding both orders.",
                    calls=[
                        durably.Call("c1", "refund", '{"order": "1042", "cents": 500}'),
                        durably.Call("c2", "refund", '{"order": "1043", "cents": 700}'),
                    ],
                    usage=durably.Usage(input_tokens=300, output_tokens=40),
                ),
                durably.Reply(
                    text="Telling the customer.",
                    calls=[durably.Call("c3", "send_email", '{"to": "a@b.c", "text": "done"}')],
                    usage=durably.Usage(input_tokens=420, output_tokens=30),
                ),
                durably.Reply(text="Both refunded; customer told.", usage=durably.Usage()),
            ],
            log=world.root / "model.jsonl",
            fickle=world.config.fickle,
        )
        tools = world.config.adapt([refund, send_email])
        return durably.Agent(model=model, tools=tools, store=world.store(), approver=approver)

    def call_log(self, world: World) -> durably.CallLog:
        """Where the model's calls are logged."""
        return durably.CallLog(world.root / "model.jsonl")

    def effects(self, world: World) -> Counter[str]:
        """What the run did to the world: each refund and each email."""
        found = Counter(f"refund {e['order']}" for e in self._ledger(world).entries())
        found.update(f"email {p.read_text()}" for p in (world.root / "mail").iterdir())
        return found

    def oracle(self, world: World, request: durably.ResolveRequest) -> durably.Rerun | durably.Done:
        """A person who answers from the world: done when the effect is there, else rerun."""
        if (
            request.tool == "send_email"
            and (world.root / "mail" / f"{request.idempotency_key}.txt").exists()
        ):
            return durably.Done("sent (checked by a person)")
        if any(e["key"] == request.idempotency_key for e in self._ledger(world).entries()):
            return durably.Done("refunded (checked by a person)")
        return durably.Rerun()

    def checks(self, world: World, state: durably.RunState) -> list[str]:
        """A problem when the run did not end with the expected answer."""
        return [] if state.answer == "Both refunded; customer told." else ["wrong answer"]

    def fingerprint(self, world: World) -> str:
        """A digest of the files a crash could have changed."""
        files = [world.store_dir / "sweep-run.json", world.root / "ledger.jsonl"]
        files += sorted((world.root / "mail").iterdir())
        files += [world.root / "model.jsonl", world.questions_log]
        return digest_files(files)


@pytest.mark.timeout(300)  # 116-120 s seen on a loaded 2-core machine
def test_a_job_built_from_the_public_api_sweeps_clean_at_depth_two() -> None:
    """A refund job swept at every crash point, twice over, never duplicates or loses a refund."""
    report = assert_clean(RefundJob(), configs=CONFIGS[:3], depth=2, jobs=2)
    rows = report.rows()
    assert [r.depth for r in rows] == [1, 2] * 3
    assert all(r.scenarios > 0 and r.duplicates == 0 and r.lost == 0 for r in rows)
    assert rows[0].questions == 0  # keys honoured: nothing gets past the ladder's first step


class WhereJob(RefundJob):
    """The refund job, noting where each world it prepares lives."""

    def __init__(self, notes: Path) -> None:
        self.notes = notes

    @override
    def prepare(self, world: World) -> None:
        super().prepare(world)
        with self.notes.open("a") as out:
            out.write(f"{world.root}\n")


def test_scenario_worlds_live_in_the_scratch_root(tmp_path: Path) -> None:
    """Every scenario's world is made under the sweep's scratch root: /dev/shm when writable."""
    notes = tmp_path / "roots.txt"
    run_sweep(WhereJob(notes), configs=CONFIGS[:1], depth=1, jobs=1)
    shm = Path("/dev/shm")
    writable = shm.is_dir() and os.access(shm, os.W_OK)
    assert scratch_root() == (str(shm) if writable else None)
    where = Path(scratch_root() or tempfile.gettempdir())
    roots = [Path(line) for line in notes.read_text().splitlines()]
    assert len(roots) > 3
    assert all(root.is_relative_to(where) for root in roots), roots


def test_second_crashes_from_the_kept_disk_judge_as_from_fresh_worlds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Laying the first kill's disk down again is the same as killing a fresh world again."""

    def verdicts(report: SweepReport) -> list[dict[str, object]]:
        return [{k: v for k, v in asdict(r).items() if k != "error"} for r in report.results]

    kept = run_sweep(RefundJob(), configs=CONFIGS[1:2], depth=2, jobs=2)

    def uncopyable(root: Path) -> Tree:
        raise Uncopyable(f"{root} (as if it held a socket)")

    monkeypatch.setattr(Tree, "read", uncopyable)  # workers fork after this
    fresh = run_sweep(RefundJob(), configs=CONFIGS[1:2], depth=2, jobs=2)
    assert len([r for r in kept.results if r.depth == 2]) > 10
    assert verdicts(kept) == verdicts(fresh)


def test_progress_has_its_total_before_the_first_scenario_and_never_changes_it() -> None:
    """The bar's total is the first crashes, known before any scenario runs: the first call
    gives it with nothing done, every later call gives the same total, and done only rises,
    to it. A total of scenarios moved: depth-2 scenarios are found only by first restarts.
    """
    calls: list[tuple[int, int]] = []
    seen: list[int] = []
    report = run_sweep(
        RefundJob(),
        configs=CONFIGS[:1],
        depth=2,
        jobs=2,
        progress=lambda *c: calls.append(c),
        on_results=lambda found: seen.append(len(found)),
    )
    total = calls[0][1]
    assert calls[0] == (0, total)
    assert total == len([r for r in report.results if r.depth == 1])  # one per first crash
    assert {t for _, t in calls} == {total}
    done = [d for d, _ in calls]
    assert done == sorted(set(done))
    assert done[-1] == total
    assert len(calls) > 2  # more than one batch: the total held while work was done
    assert sum(seen) == len(report.results)  # every scenario reported as it was judged


def test_a_worker_whose_warm_up_fails_still_starts(capsys: pytest.CaptureFixture[str]) -> None:
    """A warm-up that raises is reported and passed over (a raising pool initializer loops)."""

    class Unbuildable(RefundJob):
        def agent(self, world: World, approver: durably.Approver) -> durably.Agent:
            raise RuntimeError("no agent today")

    try:
        pool.warm_up(Unbuildable(), CONFIGS[0], None)
    finally:
        gc.unfreeze()
    assert "no agent today" in capsys.readouterr().err


class _Untouchable(RefundJob):
    """A job that fails the test if the sweep starts any work with it."""

    def prepare(self, world: World) -> None:
        raise AssertionError("the sweep started work it should have refused")


@pytest.mark.parametrize("jobs", [0, -2])
def test_a_sweep_without_workers_is_refused_before_any_work(jobs: int) -> None:
    """``jobs`` below 1 is a ValueError naming it, raised before the job is run even once."""
    with pytest.raises(ValueError, match=f"jobs .* must be 1 or more, got {jobs}"):
        run_sweep(_Untouchable(), configs=CONFIGS[:1], jobs=jobs)
    with pytest.raises(ValueError, match=f"got {jobs}"):
        run_power_loss_sweep(_Untouchable(), config=CONFIGS[0], jobs=jobs)


class _KnobbedUntouchable(_Untouchable):
    """An untouchable job with one knob of its own world."""

    knobs = MappingProxyType({"slow tracker": "the tracker answers late"})


def test_a_knob_the_job_does_not_know_is_refused_before_any_work() -> None:
    """A configuration's knob belongs to the job: one it does not list is a ValueError naming
    the configuration, the knob and the knobs it knows, before the job is run even once.
    """
    unknown = Config(name="odd world", knobs=frozenset({"no refile guard"}))
    with pytest.raises(ValueError, match=r"'odd world' turns on .*'no refile guard'.*knows: none"):
        run_sweep(_Untouchable(), configs=[unknown])
    with pytest.raises(ValueError, match="knows: 'slow tracker'"):
        run_sweep(_KnobbedUntouchable(), configs=[CONFIGS[0], unknown])
    with pytest.raises(ValueError, match="'no refile guard'"):
        run_power_loss_sweep(_Untouchable(), config=unknown)


def test_the_baselines_of_the_second_job_fail_as_they_must() -> None:
    """Naive retry duplicates refunds and at-most-once loses them, for the refund job too."""
    baselines = [c for c in CONFIGS if not c.protected]
    report = run_sweep(RefundJob(), configs=baselines, depth=1, jobs=2)
    naive, at_most_once = report.rows()
    assert naive.duplicates > 0
    assert at_most_once.lost > 0
    assert report.problems() == []


FILE_LIMIT = 256
"""Open files allowed to the reference sweep: a scenario that leaks a descriptor runs out."""

_LIMITED = (
    "import resource, runpy, sys\n"
    f"resource.setrlimit(resource.RLIMIT_NOFILE, ({FILE_LIMIT}, {FILE_LIMIT}))\n"
    "sys.argv[0] = 'durably'\n"
    "runpy.run_module('durably', run_name='__main__')\n"
)
"""``python -c`` code: the durably command, in a process allowed :data:`FILE_LIMIT` files."""


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_reference_triage_sweep_matches_the_table_in_the_repository(tmp_path: Path) -> None:
    """``durably sweep`` (all configurations, depth 2), run in a child allowed 256 open files,
    exits 0 with the table kept in tests/testdata: no descriptor leaks from scenario to scenario.
    """
    text, report = tmp_path / "sweep.txt", tmp_path / "sweep.json"
    command = [sys.executable, "-c", _LIMITED, "sweep", "--depth", "2", "--jobs", "2"]
    done = subprocess.run(
        [*command, "--text", str(text), "--json", str(report)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=stretched(1100),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    if os.environ.get("DURABLY_REGENERATE"):
        REFERENCE.write_text(text.read_text())
    assert text.read_text() == REFERENCE.read_text()
    found = json.loads(report.read_text())
    assert found["ok"], found["problems"]
    rows = found["rows"]
    assert {r["config"] for r in rows} == {c.name for c in CONFIGS}
    for row in rows:
        assert row["scenarios"] > 0
        assert row["errors"] == 0
        if row["protected"]:
            assert (row["duplicates"], row["lost"], row["paid_twice"]) == (0, 0, 0)
            assert (row["failed_checks"], row["finished"]) == (0, row["scenarios"])
    questions = {(r["config"], r["depth"]): r["questions"] for r in rows}
    assert questions[("keys honoured", 1)] == questions[("keys honoured", 2)] == 0
    assert questions[("lookups off", 1)] > 0  # every in-doubt write reaches a person
