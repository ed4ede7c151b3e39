"""Deterministic run states, built the same way in the test process and in its children.

The first state is the store conformance suite's (:mod:`durably.testing.states`);
``state_b`` is a run mid-turn, phase ``tools``.
"""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec

from durably.state import (
    Approval,
    AssistantMessage,
    AttemptMarker,
    Decision,
    Effect,
    Fingerprint,
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
from durably.testing.states import first_state

CREATED = datetime(2025, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)


state_a = first_state
"""A run that has only its task: the state a run is created with."""


def state_b(run_id: str) -> RunState:
    """The same run one turn later, with every kind of record filled in."""
    call = ToolCall(id="call_1", name="write_file", arguments='{"path": "notes.md"')
    return RunState(
        run_id=run_id,
        task="triage the flaky test",
        created_at=CREATED,
        phase=Phase.TOOLS,
        messages=[
            UserMessage(text="triage the flaky test"),
            AssistantMessage(
                text="I will write notes — naïvely, with ünïcode.",
                calls=(call,),
                usage=Usage(input_tokens=1200, output_tokens=80),
                dollars=0.0042,
                model="model-x",
                turn=1,
            ),
            ToolResult(call_id="call_0", name="read_file", content="line\n" * 40),
        ],
        summary="earlier: looked at CI logs",
        summarized=2,
        usage=Usage(input_tokens=1200, output_tokens=80, cache_read_tokens=7),
        dollars=0.0042,
        turns=1,
        resumes=1,
        pending={
            "call_2": Approval(call_id="call_2", tool="deploy", arguments="{}", asked_at=CREATED)
        },
        decisions={"call_1": Decision(approved=True, reason="fine", decided_at=CREATED)},
        markers={
            "call_1": AttemptMarker(
                key="0" * 32, tool="write_file", started_at=CREATED, intended={"notes.md": "a" * 64}
            )
        },
        resolutions={
            "call_0": Resolution(step=2, outcome=ResolutionOutcome.FOUND, detail="by key")
        },
        workspace={"notes.md": "b" * 64},
        fingerprint=Fingerprint(
            model="model-x",
            system_sha256="c" * 64,
            tools=(ToolPrint(name="write_file", effect=Effect.WRITE, schema_sha256="d" * 64),),
        ),
    )


def without_saved_at(state: RunState) -> RunState:
    """The state with the store's save time cleared, for comparing with what was saved."""
    return msgspec.structs.replace(state, saved_at=None)
