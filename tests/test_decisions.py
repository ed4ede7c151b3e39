"""A person's answer is saved under the run's lock as ``resume(decisions=)`` records it."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import durably
from _helpers.patience import stretched
from _helpers.samples import state_a
from durably import Agent, Call, Effect, Phase, Reply, ScriptedModel, ToolContext, tool
from durably.approval import Answer
from durably.decisions import AskLater, answer, parse_answer, questions, record_answer
from durably.errors import AnswerRefused, Locked
from durably.state import encode_state
from durably.stores import Store
from durably.stores.directory import DirectoryStore
from durably.stores.file import FileStore
from durably.stores.journal import JournalStore
from durably.tools import ToolInDoubt

RUN = "refund-1"
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def clock() -> datetime:
    """The fixed time every decision is stamped with."""
    return NOW


class Ledger:
    """What the tools did to the world, in this process."""

    def __init__(self) -> None:
        self.refunds: list[str] = []
        self.keys: set[str] = set()
        """The payment service deduplicates on the keys it was sent."""
        self.posts = 0
        self.fail_first_post = True


def build(store: Store, ledger: Ledger, *, in_doubt: bool = False) -> Agent:
    """An agent that refunds (needs approval) or posts (a write that may be left in doubt)."""

    @tool(effect=Effect.KEYED, key_ttl=timedelta(hours=23), needs_approval=True)
    async def refund(ctx: ToolContext, order_id: str) -> str:
        """Refund an order."""
        if ctx.idempotency_key not in ledger.keys:
            ledger.keys.add(ctx.idempotency_key)
            ledger.refunds.append(order_id)
        return f"refunded {order_id}"

    @tool(effect=Effect.WRITE)
    async def post(ctx: ToolContext, text: str) -> str:
        """Post a note (no key, no lookup: a lost reply leaves it to a person)."""
        ledger.posts += 1
        if ledger.fail_first_post:
            ledger.fail_first_post = False
            raise ToolInDoubt("the connection dropped before the reply")
        return "posted"

    first = (
        Call(id="c1", name="post", arguments='{"text": "hi"}')
        if in_doubt
        else Call(id="c1", name="refund", arguments='{"order_id": "1042"}')
    )
    model = ScriptedModel([Reply(text="working", calls=[first]), Reply(text="all done")])
    return Agent(model=model, tools=[refund, post], store=store, approver=AskLater(), clock=clock)


def paused(store: Store, ledger: Ledger, *, in_doubt: bool = False) -> None:
    """Run the refund agent until it pauses for a person."""
    outcome = asyncio.run(
        build(store, ledger, in_doubt=in_doubt).run("refund order 1042", run_id=RUN)
    )
    assert outcome.status == "paused"


def test_an_answered_approval_lets_the_resume_run_the_call_once(store: FileStore) -> None:
    """An approval answered with yes is saved as a decision; the next resume runs the call once."""
    ledger = Ledger()
    paused(store, ledger)
    assert [q.call_id for q in questions(store.read_sync(RUN))] == ["c1"]

    saved = asyncio.run(
        answer(store, run_id=RUN, call_id="c1", decision=durably.Yes(), clock=clock)
    )

    assert saved.pending == {}
    assert saved.phase is Phase.TOOLS
    assert saved.decisions["c1"].approved
    assert saved.decisions["c1"].decided_at == NOW
    assert store.read_sync(RUN).decisions == saved.decisions
    outcome = asyncio.run(build(store, ledger).resume(RUN))
    assert (outcome.status, outcome.answer, ledger.refunds) == ("done", "all done", ["1042"])


def test_who_answered_is_saved_and_kept_after_the_run_finished(store: FileStore) -> None:
    """``answer(by=...)`` saves who answered; the run-long record keeps it after the reply."""
    ledger = Ledger()
    paused(store, ledger)

    asyncio.run(
        answer(
            store,
            run_id=RUN,
            call_id="c1",
            decision=durably.No("not this order"),
            clock=clock,
            by="alice (durably answer)",
        )
    )

    saved = store.read_sync(RUN)
    assert saved.decisions["c1"].by == "alice (durably answer)"
    assert saved.approvals_given == saved.decisions
    asyncio.run(build(store, ledger).resume(RUN))
    finished = store.read_sync(RUN)
    assert (finished.phase, finished.decisions) == (Phase.DONE, {})
    assert finished.approvals_given["c1"] == durably.state.Decision(
        approved=False, reason="not this order", decided_at=NOW, by="alice (durably answer)"
    )


@pytest.mark.parametrize("given", [durably.Rerun(), durably.Done("posted (seen by a person)")])
def test_who_settled_an_in_doubt_call_is_saved_with_its_resolution(
    store: FileStore, given: Answer
) -> None:
    """A step-3 answer keeps ``by`` on its resolution through the resume."""
    ledger = Ledger()
    paused(store, ledger, in_doubt=True)

    asyncio.run(answer(store, run_id=RUN, call_id="c1", decision=given, clock=clock, by="bob"))
    asyncio.run(build(store, ledger, in_doubt=True).resume(RUN))

    resolution = store.read_sync(RUN).resolutions["c1"]
    assert (resolution.step, resolution.by) == (3, "bob")


def test_a_refusal_reaches_the_model_and_the_call_never_runs(store: FileStore) -> None:
    """An approval answered with no gives the model the reason; the call does not run."""
    ledger = Ledger()
    paused(store, ledger)
    asyncio.run(
        answer(store, run_id=RUN, call_id="c1", decision=durably.No("not this order"), clock=clock)
    )

    outcome = asyncio.run(build(store, ledger).resume(RUN))

    assert outcome.status == "done"
    assert ledger.refunds == []
    results = [m for m in outcome.state.messages if isinstance(m, durably.state.ToolResult)]
    assert results[0].is_error
    assert "not this order" in results[0].content


@pytest.mark.parametrize(
    ("given", "posts"), [(durably.Rerun(), 2), (durably.Done("posted (seen by a person)"), 1)]
)
def test_an_in_doubt_call_is_rerun_or_taken_as_done(
    store: FileStore, given: Answer, posts: int
) -> None:
    """Rerun runs the in-doubt write again; Done records the person's result and never reruns."""
    ledger = Ledger()
    paused(store, ledger, in_doubt=True)
    [question] = questions(store.read_sync(RUN))
    assert (question.kind, question.effect, question.started_at) == ("resolve", "write", NOW)

    asyncio.run(answer(store, run_id=RUN, call_id="c1", decision=given, clock=clock))
    outcome = asyncio.run(build(store, ledger, in_doubt=True).resume(RUN))

    assert outcome.status == "done"
    assert ledger.posts == posts
    assert outcome.state.resolutions["c1"].step == 3


@pytest.mark.parametrize("given", [durably.Yes(), durably.Rerun(), durably.Done("x")])
def test_an_answer_is_the_same_decision_as_resume_with_decisions(
    tmp_path: Path, given: Answer
) -> None:
    """Answering then resuming ends in the same state as ``resume(decisions=)`` with that answer.

    Both name nobody (``by`` None: ``resume(decisions=)`` takes no ``by``), so the states,
    ``approvals_given`` and ``by`` included, must be equal byte for byte.
    """
    in_doubt = not isinstance(given, durably.Yes)
    one, two = FileStore(tmp_path / "one"), FileStore(tmp_path / "two")
    paused(one, Ledger(), in_doubt=in_doubt)
    paused(two, Ledger(), in_doubt=in_doubt)

    asyncio.run(answer(one, run_id=RUN, call_id="c1", decision=given, clock=clock))
    by_answer = asyncio.run(build(one, Ledger(), in_doubt=in_doubt).resume(RUN)).state
    by_resume = asyncio.run(
        build(two, Ledger(), in_doubt=in_doubt).resume(RUN, decisions={"c1": given})
    ).state

    by_answer.saved_at = by_resume.saved_at = None
    assert encode_state(by_answer) == encode_state(by_resume)


def test_a_question_answered_already_is_refused_and_nothing_is_saved(store: FileStore) -> None:
    """A second answer to the same question is refused with the reason; the state is untouched."""
    ledger = Ledger()
    paused(store, ledger)
    asyncio.run(answer(store, run_id=RUN, call_id="c1", decision=durably.Yes(), clock=clock))
    before = store.read_sync(RUN)

    with pytest.raises(AnswerRefused, match="already answered"):
        asyncio.run(
            answer(
                store, run_id=RUN, call_id="c1", decision=durably.No("changed my mind"), clock=clock
            )
        )

    assert encode_state(store.read_sync(RUN)) == encode_state(before)


@pytest.mark.parametrize(
    ("in_doubt", "given", "reason"),
    [
        (False, durably.Rerun(), "may run"),
        (True, durably.Yes(), "happened"),
    ],
)
def test_an_answer_that_does_not_fit_its_question_is_refused(
    store: FileStore, in_doubt: bool, given: Answer, reason: str
) -> None:
    """Rerun/Done cannot answer an approval, nor Yes/No an in-doubt call."""
    paused(store, Ledger(), in_doubt=in_doubt)
    before = encode_state(store.read_sync(RUN))

    with pytest.raises(AnswerRefused, match=reason):
        asyncio.run(answer(store, run_id=RUN, call_id="c1", decision=given, clock=clock))

    assert encode_state(store.read_sync(RUN)) == before


def test_a_finished_run_and_an_unknown_call_are_refused(store: FileStore) -> None:
    """A done run has no questions, and a call the run never made has none either."""
    ledger = Ledger()
    paused(store, ledger)
    with pytest.raises(AnswerRefused, match="no such call"):
        asyncio.run(answer(store, run_id=RUN, call_id="c9", decision=durably.Yes(), clock=clock))
    asyncio.run(answer(store, run_id=RUN, call_id="c1", decision=durably.Yes(), clock=clock))
    asyncio.run(build(store, ledger).resume(RUN))

    with pytest.raises(AnswerRefused, match="the run is done"):
        asyncio.run(answer(store, run_id=RUN, call_id="c1", decision=durably.Yes(), clock=clock))


def test_a_run_owned_elsewhere_is_locked_and_left_as_it_was(store: FileStore) -> None:
    """While another process owns the run, an answer raises Locked and saves nothing."""
    paused(store, Ledger())
    handle, _ = store.open_sync(RUN)
    try:
        with pytest.raises(Locked):
            asyncio.run(
                answer(FileStore(store.directory), run_id=RUN, call_id="c1", decision=durably.Yes())
            )
    finally:
        handle.close_sync()
    assert list(store.read_sync(RUN).pending) == ["c1"]


@pytest.mark.parametrize("kind", [FileStore, JournalStore])
def test_a_directory_store_answers_runs_of_either_file_store(
    tmp_path: Path, kind: Callable[[Path], FileStore]
) -> None:
    """Answering through a directory keeps the run readable by the store the user's code uses."""
    theirs = kind(tmp_path / "runs")
    ledger = Ledger()
    paused(theirs, ledger)
    directory = DirectoryStore(tmp_path / "runs")

    asyncio.run(answer(directory, run_id=RUN, call_id="c1", decision=durably.Yes(), clock=clock))

    assert theirs.read_sync(RUN).decisions["c1"].approved
    outcome = asyncio.run(build(kind(tmp_path / "runs"), ledger).resume(RUN))
    assert outcome.status == "done"
    assert ledger.refunds == ["1042"]


def test_typed_answers_are_parsed_and_mismatched_options_refused() -> None:
    """The four words map to the four answers; a reason or result goes only where it fits."""
    assert parse_answer("yes") == durably.Yes()
    assert parse_answer("NO", reason="too much") == durably.No("too much")
    assert parse_answer("rerun") == durably.Rerun()
    assert parse_answer("done", result="re_1") == durably.Done("re_1")
    with pytest.raises(ValueError, match="unknown answer"):
        parse_answer("maybe")
    with pytest.raises(ValueError, match="reason goes with `no`"):
        parse_answer("yes", reason="why not")
    with pytest.raises(ValueError, match="result goes with `done`"):
        parse_answer("rerun", result="x")


def test_record_answer_leaves_a_run_paused_while_other_questions_stand() -> None:
    """With two questions open, answering one keeps the run paused for the other."""
    state = state_a(RUN)
    state.messages.append(
        durably.state.AssistantMessage(
            calls=(
                durably.state.ToolCall(id="a", name="refund", arguments="{}"),
                durably.state.ToolCall(id="b", name="refund", arguments="{}"),
            ),
            turn=state.turns + 1,
        )
    )
    state.phase = Phase.PAUSED
    for call_id in ("a", "b"):
        state.pending[call_id] = durably.state.Approval(
            call_id=call_id, tool="refund", arguments="{}", asked_at=NOW
        )
    state.markers.clear()

    record_answer(state, call_id="a", decision=durably.Yes(), now=NOW)

    assert (state.phase, list(state.pending)) == (Phase.PAUSED, ["b"])
    record_answer(state, call_id="b", decision=durably.Yes(), now=NOW)
    assert (state.phase, state.pending) == (Phase.TOOLS, {})


_ANSWER_AND_DIE = """
import asyncio, sys
from durably import Yes
from durably.decisions import answer
from durably.faults import CrashPlan, installed
from durably.stores.file import FileStore
with installed(CrashPlan(label=sys.argv[2])):
    asyncio.run(answer(FileStore(sys.argv[1]), run_id="refund-1", call_id="c1", decision=Yes()))
sys.exit("the crash point was never reached")
"""


@pytest.mark.parametrize(
    ("label", "landed"),
    [
        ("store.save.temp_written", False),
        ("store.save.temp_synced", False),
        ("store.save.renamed", True),
        ("store.save.dir_synced", True),
    ],
)
def test_a_process_killed_while_answering_leaves_the_question_or_the_answer(
    store: FileStore, label: str, landed: bool
) -> None:
    """SIGKILL inside the answer's save leaves either the open question or the saved yes, whole."""
    ledger = Ledger()
    paused(store, ledger)

    child = subprocess.run(
        [sys.executable, "-c", _ANSWER_AND_DIE, str(store.directory), label],
        capture_output=True,
        text=True,
        timeout=stretched(60),
        check=False,
    )

    assert child.returncode == -signal.SIGKILL, child.stderr
    state = store.read_sync(RUN)
    assert ("c1" in state.decisions) is landed
    assert ("c1" in state.pending) is not landed
    if not landed:  # the person answers again; the lock died with the process
        asyncio.run(answer(store, run_id=RUN, call_id="c1", decision=durably.Yes(), clock=clock))
    outcome = asyncio.run(build(store, ledger).resume(RUN))
    assert outcome.status == "done"
    assert ledger.refunds == ["1042"]
