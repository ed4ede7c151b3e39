"""Run states for testing stores: the first state of a run, one with every field set, a big one.

The store conformance suite (:mod:`durably.testing.stores`) saves these; they are
deterministic, so a test and the child processes it starts build the same ones.
"""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec

from ..state import (
    FORMAT,
    Approval,
    ApprovalKind,
    AssistantMessage,
    AttemptMarker,
    Decision,
    Effect,
    Fingerprint,
    ModelCall,
    Phase,
    Resolution,
    ResolutionOutcome,
    RunState,
    ToolCall,
    ToolPrint,
    ToolResult,
    Usage,
    UserMessage,
)

__all__ = ["first_state", "full_state", "grown_state"]

_CREATED = datetime(2025, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)


def first_state(run_id: str) -> RunState:
    """A run that has only its task: the state a run is created with."""
    return RunState(
        run_id=run_id,
        task="triage the flaky test",
        created_at=_CREATED,
        messages=[UserMessage(text="triage the flaky test")],
    )


def full_state(run_id: str) -> RunState:
    """The same run later on, with every field of the state set (none left at its default).

    A store that drops, truncates or retypes any field fails the round trip of this state.
    """
    call = ToolCall(id="call_1", name="write_file", arguments='{"path": "notes.md"')
    usage = Usage(input_tokens=1200, output_tokens=80, cache_read_tokens=7, cache_write_tokens=3)
    return RunState(
        format=FORMAT,
        run_id=run_id,
        task="triage the flaky test",
        created_at=_CREATED,
        phase=Phase.PAUSED,
        messages=[
            UserMessage(text="triage the flaky test"),
            AssistantMessage(
                text="I will write notes — naïvely, with ünïcode.",
                calls=(call,),
                usage=usage,
                dollars=0.0042,
                model="model-x",
                turn=1,
            ),
            ToolResult(call_id="call_0", name="read_file", content="line\n" * 40, is_error=True),
        ],
        summary="earlier: looked at CI logs",
        summarized=2,
        usage=usage,
        dollars=0.0042,
        unsaved_dollars=0.25,
        unsaved_replies=1,
        max_dollars=5.0,
        model_call=ModelCall(
            turn=2, model="model-x", asked_at=_CREATED, messages=3, worst_dollars=0.25
        ),
        turns=1,
        resumes=1,
        answered_at=_CREATED,
        pending={
            "call_2": Approval(
                call_id="call_2",
                tool="deploy",
                arguments="{}",
                asked_at=_CREATED,
                kind=ApprovalKind.RESOLVE,
                why="the deploy may have run",
            )
        },
        decisions={"call_1": Decision(approved=True, reason="fine", decided_at=_CREATED)},
        approvals_given={"call_3": Decision(approved=False, reason="no", by="ann")},
        markers={
            "call_1": AttemptMarker(
                key="0" * 32,
                tool="write_file",
                started_at=_CREATED,
                intended={"notes.md": "a" * 64},
            )
        },
        resolutions={
            "call_0": Resolution(step=2, outcome=ResolutionOutcome.FOUND, detail="by key", by="bo")
        },
        workspace={"notes.md": "b" * 64},
        paused_with={"$schemaVersion": "1.0", "current_turn": 1, "items": [{"id": "c4"}]},
        fingerprint=Fingerprint(
            model="model-x",
            system_sha256="c" * 64,
            tools=(ToolPrint(name="write_file", effect=Effect.WRITE, schema_sha256="d" * 64),),
        ),
        answer="filed as #1",
        stop_reason="answered",
    )


def grown_state(run_id: str, approx_bytes: int) -> RunState:
    """A run whose conversation grew, turn by turn, to about ``approx_bytes`` of JSON."""
    state = first_state(run_id)
    turn = 0
    while len(msgspec.json.encode(state)) < approx_bytes:
        turn += 1
        arguments = f'{{"path": "src/module_{turn}.py", "pattern": "def .*timeout"}}'
        state.messages.append(
            AssistantMessage(
                text=f"Turn {turn}: searching for the timeout handling.",
                calls=(ToolCall(id=f"call_{turn}", name="grep", arguments=arguments),),
                usage=Usage(input_tokens=900 + turn, output_tokens=60),
                turn=turn,
            )
        )
        body = "".join(f"src/module_{turn}.py:{n}: def wait(timeout=30):\n" for n in range(12))
        state.messages.append(ToolResult(call_id=f"call_{turn}", name="grep", content=body))
        state.turns = turn
    return state
