"""The person step through the Agents SDK's own pause: ``needs_approval``, interruptions, RunState.

A call that waits for a person (durably's approval, or an in-doubt call neither a rerun
nor a lookup settles) ends ``DurableRunner.run`` the SDK's way: ``result.interruptions``,
the SDK's ``RunState.to_json()`` saved with the paused run. ``durably answer`` saves the
answer; ``runner.sdk_state`` rebuilds the SDK state with it applied, and ``run(agent,
state, run_id=...)`` carries the run on. Crashes are real SIGKILLs in forked children;
every process builds its agent anew from the world's files, as a restarted one would.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _oai_world import build
from agents import Agent, RunContextWrapper, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call

import durably
from _helpers.patience import stretched
from _helpers.refund_world import ANSWER, NOTE, TASK, Service
from durably import Effect, faults
from durably.approval import Deferred
from durably.engine import SavePoint
from durably.openai_agents import DurableRunner
from durably.state import ApprovalKind, ToolResult
from durably.sweep import RUN_ID, run_in_child

REFERENCE = {
    "refund 1042": 1,
    "email a@b.c: order 1042 is refunded": 1,
    f"note {NOTE}": 1,
}


class Away:
    """An approver nobody is at: every question waits for ``durably answer``."""

    async def approve(self, request: durably.ApprovalRequest) -> Deferred:
        """Nobody can say yes now: ask later."""
        return durably.DEFER

    async def resolve(self, request: durably.ResolveRequest) -> Deferred:
        """Nobody can tell now: ask later."""
        return durably.DEFER


class Place:
    """One test's world: a store directory, the service and the model's call log."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.service = Service(root / "service")
        self.service.prepare()
        self.log = durably.CallLog(root / "model.jsonl")

    def store(self) -> durably.FileStore:
        """A new store over the world's run directory (each process opens its own)."""
        return durably.FileStore(self.root / "runs", sync=False)

    def agent(self, **options: Any) -> tuple[Agent[Any], DurableRunner]:
        """The front-desk agent and its runner, built anew as a restarted process builds them."""
        return build(self.store(), self.service, self.log, **options)

    def state(self) -> durably.RunState:
        """The run's saved state."""
        store = self.store()
        try:
            return store.read_sync(RUN_ID)
        finally:
            store.close_sync()

    def answer(self, call_id: str, *words: str) -> None:
        """``durably answer RUN CALL WORDS...`` in a subprocess, as a person types it."""
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "durably",
                "answer",
                RUN_ID,
                call_id,
                words[0],
                "runs",
                *list(words[1:]),
            ],
            cwd=self.root,
            capture_output=True,
            text=True,
            check=False,
            timeout=stretched(120),
            env={**os.environ, "NO_COLOR": "1"},
        )
        assert done.returncode == 0, done.stderr

    def carry_on(self, **options: Any) -> Any:
        """Rebuild the saved SDK state with the answers applied, and run from it.

        The rebuilt state's approval decisions, as the SDK saves them, are kept in
        ``self.decided`` (call ID -> approved / rejected / the rejection message).
        """
        agent, runner = self.agent(**options)

        async def go() -> Any:
            state = await runner.sdk_state(agent, RUN_ID)
            self.decided = _sdk_decisions(state.to_json())
            return await runner.run(agent, state, run_id=RUN_ID)

        return asyncio.run(go())


def _sdk_decisions(saved: dict[str, Any]) -> dict[str, str]:
    """The function-tool approvals an SDK ``RunState.to_json()`` holds, by call ID."""
    found: dict[str, str] = {}
    for entry in saved["context"].get("function_tool_approvals", []):
        decision = entry["decision"]
        found.update(dict.fromkeys(decision.get("approved", []), "approved"))
        found.update(dict.fromkeys(decision.get("rejected", []), "rejected"))
        found.update(
            {k: f"rejected: {v}" for k, v in decision.get("rejection_messages", {}).items()}
        )
    return found


def _result(state: durably.RunState, call_id: str) -> ToolResult:
    return next(m for m in state.messages if isinstance(m, ToolResult) and m.call_id == call_id)


def _interrupted(result: Any) -> list[str]:
    return [item.call_id for item in result.interruptions]


@pytest.mark.parametrize(("word", "notes"), [("yes", 1), ("no", 0)])
def test_a_durably_approval_pauses_the_sdk_way_and_the_saved_answer_carries_it_on(
    tmp_path: Path, word: str, notes: int
) -> None:
    """A note that needs durably's approval ends the run with the SDK's interruption and its
    RunState saved; answered with ``durably answer`` and carried on from ``sdk_state``, the
    note is posted once (yes) or never (no, the model told why), no saved reply asked again.
    """
    place = Place(tmp_path)
    options: dict[str, Any] = {"approver": Away(), "approval": frozenset({"post_note"})}
    agent, runner = place.agent(**options)

    paused = asyncio.run(runner.run(agent, TASK, run_id=RUN_ID))

    assert _interrupted(paused) == ["c4"]
    saved = place.state()
    assert saved.phase is durably.Phase.PAUSED
    assert saved.pending["c4"].kind is ApprovalKind.APPROVE
    assert saved.paused_with is not None
    assert saved.markers == {}
    assert place.service.lines("notes") == []
    asked = place.log.turns(RUN_ID)
    assert asked == [1, 2, 3]

    place.answer("c4", word, *(["--reason", "not today"] if word == "no" else []))
    done = place.carry_on(**options)

    assert done.interruptions == []
    assert done.final_output == ANSWER
    refusal = "rejected: refused by the approver: not today"
    assert place.decided == {"c4": "approved" if word == "yes" else refusal}
    assert place.log.turns(RUN_ID) == [*asked, 4, 5]  # no saved reply paid for again
    assert len(place.service.lines("notes")) == notes
    assert len(place.service.lines("refunds")) == len(place.service.lines("emails")) == 1
    final = place.state()
    note = _result(final, "c4")
    assert note.is_error == (word == "no")
    if word == "no":
        assert note.content == "refused by the approver: not today"
    assert final.answer == ANSWER
    assert final.paused_with is None
    assert final.resumes == 0  # a person answering is not a restart


@pytest.mark.parametrize(
    ("word", "label", "notes"),
    [
        ("rerun", SavePoint.ATTEMPT.crash_point, 1),
        ("done", "loop.tool_returned:post_note", 1),
    ],
)
def test_an_in_doubt_call_asks_a_person_through_the_sdk_pause(
    tmp_path: Path, word: str, label: str, notes: int
) -> None:
    """A note killed in doubt (SIGKILL after its marker, before or after it was posted) has
    no lookup: resumed, the ladder's person step interrupts the SDK run; ``durably answer
    rerun`` posts it once, ``done`` saves the person's result and posts nothing again.
    """
    place = Place(tmp_path)
    occurrence = 3 if label == SavePoint.ATTEMPT.crash_point else 1  # refund, e-mail, note

    def killed() -> None:
        with faults.installed(faults.CrashPlan(label=label, occurrence=occurrence)):
            agent, runner = place.agent(sequential=True)
            asyncio.run(runner.run(agent, TASK, run_id=RUN_ID))

    status = run_in_child(killed)
    assert os.WIFSIGNALED(status)
    assert os.WTERMSIG(status) == signal.SIGKILL
    posted = len(place.service.lines("notes"))
    assert posted == (0 if word == "rerun" else 1)
    asked = place.log.turns(RUN_ID)

    agent, runner = place.agent(sequential=True, approver=Away())
    paused = asyncio.run(runner.resume(agent, RUN_ID))

    assert _interrupted(paused) == ["c4"]
    saved = place.state()
    assert saved.pending["c4"].kind is ApprovalKind.RESOLVE
    assert "c4" in saved.markers
    assert saved.paused_with is not None
    assert place.log.turns(RUN_ID) == asked  # every reply so far came from the store

    place.answer("c4", word, *(["--result", "noted (checked)"] if word == "done" else []))
    done = place.carry_on(sequential=True, approver=Away())

    assert done.final_output == ANSWER
    assert place.decided == {"c4": "approved"}  # served its saved result, or run again
    assert len(place.service.lines("notes")) == notes
    assert place.service.effects() == REFERENCE
    assert place.log.turns(RUN_ID) == [*asked, 5, 6]
    note = _result(place.state(), "c4")
    assert note.content == ("noted (checked)" if word == "done" else "noted")


def _with_own_approval(agent: Agent[Any], service: Service, seen: list[Any]) -> Agent[Any]:
    """``agent`` with its note tool asking the user's own ``needs_approval`` callable."""

    async def ask(ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str) -> bool:
        seen.append((call_id, params))
        return True

    @function_tool(needs_approval=ask)
    async def post_note(text: str) -> str:
        """Post a note on the order."""
        return service.post_note(text=text)

    tools = [post_note if t.name == "post_note" else t for t in agent.tools]
    return agent.clone(tools=tools)


@pytest.mark.parametrize("approve", [True, False])
def test_the_users_own_needs_approval_is_still_consulted_and_answered_on_the_sdk_state(
    tmp_path: Path, approve: bool
) -> None:
    """The user's own callable is asked about the note; the SDK interrupts, the user answers
    on the RunState as with the bare SDK; approved the note is posted once, rejected the
    rejection is saved as the call's result; durably asks nobody itself.
    """
    place = Place(tmp_path)
    seen: list[Any] = []
    agent, runner = place.agent()
    agent = _with_own_approval(agent, place.service, seen)

    paused = asyncio.run(runner.run(agent, TASK, run_id=RUN_ID))

    assert _interrupted(paused) == ["c4"]
    assert seen == [("c4", {"text": NOTE})]
    assert place.state().pending == {}  # not durably's question: nothing to `durably answer`
    assert place.state().phase is durably.Phase.PAUSED  # no worker claims it meanwhile
    assert place.state().paused_with is not None
    state = paused.to_state()
    (item,) = state.get_interruptions()
    if approve:
        state.approve(item)
    else:
        state.reject(item, rejection_message="no notes today")
    done = asyncio.run(runner.run(agent, state, run_id=RUN_ID))

    assert done.final_output == ANSWER
    assert len(place.service.lines("notes")) == (1 if approve else 0)
    final = place.state()
    note = _result(final, "c4")
    assert note.content == ("noted" if approve else "no notes today")
    given = final.approvals_given["c4"]  # the user's answer, in the run's record too
    assert given.approved is approve
    assert given.by == ("RunState.approve" if approve else "RunState.reject")
    assert place.log.turns(RUN_ID) == [1, 2, 3, 4, 5]


def test_a_paused_run_carries_on_from_its_saved_sdk_state_in_another_process(
    tmp_path: Path,
) -> None:
    """One process runs until the note waits for approval and exits; a person answers yes;
    a second process rebuilds the SDK state and finishes: every reply asked once, every
    effect once.
    """
    place = Place(tmp_path)
    options: dict[str, Any] = {"approver": Away(), "approval": frozenset({"post_note"})}

    def first() -> None:
        agent, runner = place.agent(**options)
        result = asyncio.run(runner.run(agent, TASK, run_id=RUN_ID))
        assert _interrupted(result) == ["c4"]

    assert run_in_child(first) == 0
    assert place.state().paused_with is not None
    assert place.service.lines("notes") == []
    place.answer("c4", "yes")

    def second() -> None:
        assert place.carry_on(**options).final_output == ANSWER

    assert run_in_child(second) == 0
    assert place.log.turns(RUN_ID) == [1, 2, 3, 4, 5]  # no reply paid for twice
    assert place.service.effects() == REFERENCE  # no tool run twice
    assert place.state().answer == ANSWER


def _odd_agent(calls: list[str]) -> Agent[Any]:
    """An agent whose model calls ``note`` with arguments that are not a JSON object."""

    @function_tool
    async def note(text: str) -> str:
        """Post a note."""
        calls.append(text)
        return f"noted {text}"

    model = ScriptedModel(
        [[function_call("note", "[1]", call_id="x1")], [assistant_message("finished")]]
    )
    return Agent(name="odd", model=model, tools=[note])


@pytest.mark.parametrize("needs_approval", [False, True])
def test_arguments_that_are_not_a_json_object_still_get_durablys_answer(
    tmp_path: Path, needs_approval: bool
) -> None:
    """The SDK interrupts a call whose arguments are not a JSON object without asking
    ``needs_approval``: durably answers for it anyway. Needing nobody, the call goes
    through (the tool rejects the arguments, saved as its error) and the run finishes; a
    durably approval pauses it with durably's question saved.
    """
    calls: list[str] = []
    runner = DurableRunner(
        durably.FileStore(tmp_path / "runs", sync=False),
        default_effect=Effect.WRITE,
        needs_approval={"note"} if needs_approval else (),
        approver=Away() if needs_approval else None,
    )
    result = asyncio.run(runner.run(_odd_agent(calls), TASK, run_id=RUN_ID))
    state = asyncio.run(runner.store.read(RUN_ID))  # type: ignore[union-attr]

    if needs_approval:
        assert _interrupted(result) == ["x1"]
        assert state.pending["x1"].arguments == "[1]"
        assert state.paused_with is not None
    else:
        assert result.interruptions == []
        assert result.final_output == "finished"
        assert _result(state, "x1").is_error
    assert calls == []


def test_a_durably_approval_approved_on_the_sdk_state_is_the_persons_yes(tmp_path: Path) -> None:
    """Approving durably's question on the returned RunState (as with the bare SDK) is a
    person's yes: saved as durably's answer, the note posted once.
    """
    place = Place(tmp_path)
    agent, runner = place.agent(approver=Away(), approval=frozenset({"post_note"}))
    paused = asyncio.run(runner.run(agent, TASK, run_id=RUN_ID))
    state = paused.to_state()
    (item,) = state.get_interruptions()
    state.approve(item)

    done = asyncio.run(runner.run(agent, state, run_id=RUN_ID))

    assert done.final_output == ANSWER
    assert place.service.effects() == REFERENCE
    final = place.state()
    assert final.approvals_given["c4"].approved
    assert final.approvals_given["c4"].by == "RunState.approve"
    assert place.log.turns(RUN_ID) == [1, 2, 3, 4, 5]


def test_an_in_doubt_call_rejected_on_the_sdk_state_is_refused_until_a_person_answers(
    tmp_path: Path,
) -> None:
    """A rejection on the SDK's RunState cannot say whether an in-doubt call happened: the
    run stops before asking the model, saying to answer rerun or done; answered, it finishes.
    """
    place = Place(tmp_path)

    def killed() -> None:
        with faults.installed(faults.CrashPlan(label="loop.tool_returned:post_note")):
            agent, runner = place.agent(sequential=True)
            asyncio.run(runner.run(agent, TASK, run_id=RUN_ID))

    assert os.WIFSIGNALED(run_in_child(killed))
    agent, runner = place.agent(sequential=True, approver=Away())
    state = asyncio.run(runner.resume(agent, RUN_ID)).to_state()
    (item,) = state.get_interruptions()
    state.reject(item, rejection_message="no")
    asked = place.log.turns(RUN_ID)

    with pytest.raises(ValueError, match="'c4' of tool 'post_note' may have acted"):
        asyncio.run(runner.run(agent, state, run_id=RUN_ID))

    assert place.log.turns(RUN_ID) == asked
    assert "c4" in place.state().pending
    place.answer("c4", "done", "--result", "noted (checked)")
    assert place.carry_on(sequential=True, approver=Away()).final_output == ANSWER
    assert place.service.effects() == REFERENCE
