"""Approvals: a call needing a yes pauses the run, and its marker is saved only after the yes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest
from _loop_world import (
    ANSWER,
    PERSON_SAYS,
    TASK,
    Job,
    RecordingModel,
    Toolset,
    World,
    answer,
    reply,
    resume,
    start,
    tool_results,
)
from typing_extensions import override

import durably
from durably import Phase, faults
from durably.approval import ApprovalRequest, ResolveRequest
from durably.faults import CrashPlan

ONE_WRITE = (reply(("w1", "write", '{"note": "refund A1"}')), answer())
NEEDS_YES = Toolset(write_needs_approval=True)


class AskedWhileDying(durably.ScriptedApprover):
    """A person who is still reading the question when the process is killed."""

    @override
    async def approve(self, request: ApprovalRequest) -> durably.Yes | durably.No:
        decision = await super().approve(request)
        faults.point("test.approver.asking")
        return decision

    @override
    async def resolve(self, request: ResolveRequest) -> durably.Rerun | durably.Done:
        decision = await super().resolve(request)
        faults.point("test.approver.asking")
        return decision


class Deferring(durably.ScriptedApprover):
    """A person who answers later, through ``resume(decisions=...)``; logs what it was asked."""

    @override
    async def approve(self, request: ApprovalRequest) -> durably.Yes | durably.No:
        self._note("approve", request.call_id)
        return durably.DEFER  # type: ignore[return-value]

    @override
    async def resolve(self, request: ResolveRequest) -> durably.Rerun | durably.Done:
        self._note("resolve", request.call_id)
        return durably.DEFER  # type: ignore[return-value]

    def _note(self, kind: str, call_id: str) -> None:
        assert self.log is not None
        with self.log.open("a") as out:
            out.write(json.dumps({"kind": kind, "call_id": call_id}) + "\n")


class OnCall(durably.ScriptedApprover):
    """An approver that names itself."""

    name = "ops on call"


def test_a_crash_while_the_approver_is_asked_asks_again_on_resume(world: World) -> None:
    """A SIGKILL while a person is being asked leaves the run paused, and the resume asks again."""
    job = Job(replies=ONE_WRITE, toolset=NEEDS_YES, approver_class=AskedWhileDying)

    crashed = start(world, job, plan=CrashPlan(label="test.approver.asking"))

    assert crashed.killed
    paused = world.state()
    assert (paused.phase, list(paused.pending), paused.markers) == (Phase.PAUSED, ["w1"], {})
    resumed = resume(world, job)
    assert resumed.finished()["answer"] == ANSWER
    assert world.questions("approve") == ["w1", "w1"]
    assert len(world.receiver().effects("write")) == 1
    assert world.questions("resolve") == []


def test_a_crash_while_a_person_settles_an_in_doubt_call_asks_again(world: World) -> None:
    """A SIGKILL while a person is asked about an in-doubt call leaves the question saved."""
    job = Job(
        replies=ONE_WRITE,
        toolset=Toolset(write_lookup="none"),
        resolve=(durably.Done(PERSON_SAYS),),
        approver_class=AskedWhileDying,
    )
    assert start(world, job, plan=CrashPlan(label="loop.tool_returned:write")).killed

    assert resume(world, job, plan=CrashPlan(label="test.approver.asking")).killed

    paused = world.state()
    assert (paused.phase, paused.pending["w1"].kind, list(paused.markers)) == (
        Phase.PAUSED,
        "resolve",
        ["w1"],
    )
    resumed = resume(world, job)
    assert resumed.finished()["answer"] == ANSWER
    assert world.questions("resolve") == ["w1", "w1"]
    assert tool_results(world.state()) == [("w1", PERSON_SAYS, False)]
    assert world.state().resolutions["w1"].by == "AskedWhileDying"
    assert len(world.receiver().effects("write")) == 1


def test_the_attempt_marker_is_saved_only_after_the_yes(
    make_world: Callable[[str], World],
) -> None:
    """The pause save holds the question and no marker; the attempt save holds marker and yes."""
    job = Job(replies=ONE_WRITE, toolset=NEEDS_YES)
    at_pause, at_attempt = make_world("pause"), make_world("attempt")

    assert start(at_pause, job, plan=CrashPlan(label="loop.saved.pause")).killed
    assert start(at_attempt, job, plan=CrashPlan(label="loop.saved.attempt")).killed

    paused = at_pause.state()
    assert (paused.phase, list(paused.pending)) == (Phase.PAUSED, ["w1"])
    assert (paused.markers, paused.decisions) == ({}, {})
    assert at_pause.questions("approve") == []  # the crash came before the question
    attempted = at_attempt.state()
    assert (attempted.phase, attempted.pending, list(attempted.markers)) == (
        Phase.TOOLS,
        {},
        ["w1"],
    )
    assert attempted.decisions["w1"].approved is True
    assert attempted.approvals_given["w1"] == attempted.decisions["w1"]
    assert attempted.approvals_given["w1"].by == "ScriptedApprover"
    assert attempted.markers["w1"].key == durably.idempotency_key(attempted.run_id, "w1")
    assert at_attempt.receiver().effects() == []


def test_a_no_reaches_the_model_as_an_error_and_the_tool_never_runs(world: World) -> None:
    """A refused call gets an error result carrying the reason, sent to the model; it never acts."""
    job = Job(replies=ONE_WRITE, toolset=NEEDS_YES, approve=(durably.No("refunds need a manager"),))
    model = RecordingModel(job.replies, log=world.model_log)

    outcome = asyncio.run(job.agent(world, model=model).run(TASK, name="job"))

    assert outcome.answer == ANSWER
    assert world.receiver().entries() == []
    (refusal,) = tool_results(outcome.state)
    assert refusal[0] == "w1"
    assert refusal[2] is True
    assert "refunds need a manager" in refusal[1]
    assert model.requests[1].messages[-1] == outcome.state.messages[2]
    assert world.state().messages == outcome.state.messages


def test_the_approvers_name_is_kept_with_its_decision_for_the_runs_life(world: World) -> None:
    """An approver's ``name`` is recorded as who answered, and stays after the reply moved on."""
    job = Job(
        replies=ONE_WRITE,
        toolset=NEEDS_YES,
        approve=(durably.No("needs a manager"),),
        approver_class=OnCall,
    )

    outcome = asyncio.run(job.agent(world).run(TASK, name="job"))

    assert outcome.status == "done"
    saved = world.state()
    assert saved.decisions == {}
    given = saved.approvals_given["w1"]
    assert (given.approved, given.reason, given.by) == (False, "needs a manager", "ops on call")
    assert given.decided_at is not None


def test_a_deferred_approval_pauses_the_run_until_a_decision_is_given(world: World) -> None:
    """An approver answering DEFER leaves the run paused; a Yes() given on resume finishes it."""
    job = Job(replies=ONE_WRITE, toolset=NEEDS_YES, approver_class=Deferring)

    paused = asyncio.run(job.agent(world).run(TASK, name="job"))

    assert (paused.status, [p.call_id for p in paused.pending]) == ("paused", ["w1"])
    assert (paused.pending[0].kind, paused.pending[0].tool) == ("approve", "write")
    assert world.state().phase is Phase.PAUSED
    assert world.receiver().entries() == []

    done = asyncio.run(job.agent(world).resume(paused.run_id, decisions={"w1": durably.Yes()}))

    assert (done.status, done.answer, done.pending) == ("done", ANSWER, ())
    assert len(world.receiver().effects("write")) == 1
    assert world.questions("approve") == ["w1"]  # the decision came with the resume
    given = world.state().approvals_given["w1"]
    assert (given.approved, given.by) == (True, None)  # resume(decisions=) names nobody


def test_a_deferred_in_doubt_call_takes_the_persons_result_on_resume(world: World) -> None:
    """A deferred in-doubt call pauses the run; the Done(...) given later is the call's result."""
    job = Job(replies=ONE_WRITE, toolset=Toolset(write_lookup="none"), approver_class=Deferring)
    assert start(world, job, plan=CrashPlan(label="loop.tool_returned:write")).killed

    paused = asyncio.run(job.agent(world).resume(world.run_id()))

    assert (paused.status, [(p.call_id, p.kind) for p in paused.pending]) == (
        "paused",
        [("w1", "resolve")],
    )
    assert "no lookup" in (paused.pending[0].why or "")
    done = asyncio.run(
        job.agent(world).resume(paused.run_id, decisions={"w1": durably.Done(PERSON_SAYS)})
    )
    assert (done.status, tool_results(done.state)) == ("done", [("w1", PERSON_SAYS, False)])
    assert (done.state.resolutions["w1"].step, done.state.resolutions["w1"].outcome) == (3, "done")
    assert len(world.receiver().effects("write")) == 1


def test_a_decision_that_does_not_fit_its_question_is_refused(world: World) -> None:
    """Answering an approval question with Rerun() is refused and the run stays as it was."""
    job = Job(replies=ONE_WRITE, toolset=NEEDS_YES, approver_class=Deferring)
    paused = asyncio.run(job.agent(world).run(TASK, name="job"))

    with pytest.raises(ValueError, match="waits for approval"):
        asyncio.run(job.agent(world).resume(paused.run_id, decisions={"w1": durably.Rerun()}))

    assert list(world.state().pending) == ["w1"]
    assert world.state().resolutions == {}
    assert world.receiver().entries() == []
