"""The run state: every record survives JSON, unset stays unset, formats are versioned."""

from __future__ import annotations

from datetime import UTC
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

import durably
from _helpers.samples import CREATED, state_a, state_b
from durably.state import (
    FORMAT,
    MIGRATIONS,
    Approval,
    AssistantMessage,
    AttemptMarker,
    Decision,
    Effect,
    Fingerprint,
    ModelCall,
    Phase,
    Resolution,
    RunState,
    ToolCall,
    ToolPrint,
    ToolResult,
    Usage,
    UserMessage,
    decode_state,
    encode_state,
)

# Strategies, one per field of every record, so that a new field without a strategy fails
# test_strategies_cover_every_field instead of silently going untested.
counts = st.integers(min_value=0, max_value=2**53)
money = st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False)
text = st.text(max_size=40)
maybe_text = st.none() | text
moments = st.datetimes(timezones=st.just(UTC))
hex64 = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)

FIELDS: dict[type[msgspec.Struct], dict[str, st.SearchStrategy[Any]]] = {}
FIELDS[Usage] = {
    "input_tokens": counts,
    "output_tokens": counts,
    "cache_read_tokens": counts,
    "cache_write_tokens": counts,
}
usages = st.builds(Usage, **FIELDS[Usage])
FIELDS[ToolCall] = {"id": text, "name": text, "arguments": text}
tool_calls = st.builds(ToolCall, **FIELDS[ToolCall])
FIELDS[UserMessage] = {"text": text}
FIELDS[AssistantMessage] = {
    "text": maybe_text,
    "calls": st.lists(tool_calls, max_size=3).map(tuple),
    "usage": usages,
    "dollars": money,
    "model": maybe_text,
    "turn": counts,
}
FIELDS[ToolResult] = {"call_id": text, "name": text, "content": text, "is_error": st.booleans()}
FIELDS[AttemptMarker] = {
    "key": text,
    "tool": text,
    "started_at": moments,
    "intended": st.dictionaries(text, hex64, max_size=3),
}
FIELDS[Approval] = {
    "call_id": text,
    "tool": text,
    "arguments": text,
    "asked_at": moments,
    "kind": st.sampled_from(["approve", "resolve"]),
    "why": maybe_text,
}
FIELDS[Decision] = {
    "approved": st.booleans(),
    "reason": maybe_text,
    "decided_at": st.none() | moments,
    "by": maybe_text,
}
FIELDS[Resolution] = {
    "step": st.integers(min_value=1, max_value=3),
    "outcome": st.sampled_from(["rerun", "found", "not-found", "done"]),
    "detail": maybe_text,
    "by": maybe_text,
}
FIELDS[ToolPrint] = {
    "name": text,
    "effect": st.sampled_from(Effect),
    "schema_sha256": hex64,
    "needs_approval": st.booleans(),
}
tool_prints = st.builds(ToolPrint, **FIELDS[ToolPrint])
FIELDS[Fingerprint] = {
    "model": text,
    "system_sha256": hex64,
    "tools": st.lists(tool_prints, max_size=3).map(tuple),
}
FIELDS[ModelCall] = {
    "turn": counts,
    "model": text,
    "asked_at": moments,
    "messages": counts,
    "worst_dollars": money,
    "worst_usage": usages,
}
messages = (
    st.builds(UserMessage, **FIELDS[UserMessage])
    | st.builds(AssistantMessage, **FIELDS[AssistantMessage])
    | st.builds(ToolResult, **FIELDS[ToolResult])
)
FIELDS[RunState] = {
    "format": st.just(FORMAT),
    "run_id": text,
    "task": text,
    "created_at": moments,
    "phase": st.sampled_from(Phase),
    "messages": st.lists(messages, max_size=5),
    "summary": maybe_text,
    "summarized": counts,
    "usage": usages,
    "dollars": money,
    "unsaved_dollars": money,
    "unsaved_replies": counts,
    "max_dollars": st.none() | st.floats(min_value=0.01, max_value=1e6),
    "model_call": st.none() | st.builds(ModelCall, **FIELDS[ModelCall]),
    "turns": counts,
    "resumes": counts,
    "answered_at": st.none() | moments,
    "pending": st.dictionaries(text, st.builds(Approval, **FIELDS[Approval]), max_size=2),
    "decisions": st.dictionaries(text, st.builds(Decision, **FIELDS[Decision]), max_size=2),
    "approvals_given": st.dictionaries(text, st.builds(Decision, **FIELDS[Decision]), max_size=2),
    "markers": st.dictionaries(text, st.builds(AttemptMarker, **FIELDS[AttemptMarker]), max_size=2),
    "resolutions": st.dictionaries(text, st.builds(Resolution, **FIELDS[Resolution]), max_size=2),
    "workspace": st.dictionaries(text, hex64, max_size=3),
    "paused_with": st.none()
    | st.dictionaries(text, st.none() | st.booleans() | st.integers() | text, max_size=3),
    "fingerprint": st.none() | st.builds(Fingerprint, **FIELDS[Fingerprint]),
    "answer": maybe_text,
    "stop_reason": maybe_text,
    "saved_at": st.none() | moments,
}
RECORDS = sorted(FIELDS, key=lambda cls: cls.__name__)


def test_strategies_cover_every_field() -> None:
    """Every field of every state record has a strategy in these round-trip tests."""
    for cls in RECORDS:
        names = {field.name for field in msgspec.structs.fields(cls)}
        assert set(FIELDS[cls]) == names, cls.__name__


@pytest.mark.parametrize("cls", RECORDS, ids=lambda cls: cls.__name__)
@given(data=st.data())
def test_every_record_round_trips_through_json(
    cls: type[msgspec.Struct], data: st.DataObject
) -> None:
    """Any value of any state record decodes from its JSON as an equal value."""
    record = data.draw(st.builds(cls, **FIELDS[cls]))
    assert msgspec.json.decode(msgspec.json.encode(record), type=cls) == record


@given(state=st.builds(RunState, **FIELDS[RunState]))
def test_run_state_round_trips_through_its_codec(state: RunState) -> None:
    """encode_state then decode_state gives back an equal run state."""
    assert decode_state(encode_state(state)) == state


def test_unset_fields_are_omitted_from_the_json() -> None:
    """A fresh run state's JSON holds only what was set (and the format), no empty values."""
    state = RunState(run_id="r1", task="t", created_at=CREATED)
    document = msgspec.json.decode(encode_state(state))
    assert set(document) == {"format", "run_id", "task", "created_at"}
    assert "messages" not in document


def test_an_unset_optional_loads_as_absent_not_empty() -> None:
    """A reply without text loads with text None, never as an empty string."""
    reply = AssistantMessage(calls=(ToolCall(id="c1", name="t", arguments="{}"),))
    encoded = msgspec.json.encode(reply)
    assert b'"text"' not in encoded
    assert msgspec.json.decode(encoded, type=AssistantMessage).text is None


def test_the_format_version_is_written_in_every_state() -> None:
    """The format number is on disk even when it is the current one, so a later durably can tell."""
    document = msgspec.json.decode(encode_state(state_a("r1")))
    assert document["format"] == FORMAT


def test_invalid_json_in_tool_arguments_saves_and_loads(store: durably.FileStore) -> None:
    """Arguments the model got wrong are kept byte for byte: the run that needs saving saves."""
    broken = '{"path": "a.txt", "content": "unterminated'
    state = state_a("r1")
    state.messages.append(AssistantMessage(calls=(ToolCall(id="c1", name="w", arguments=broken),)))
    store.create_sync(state).close_sync()
    loaded = store.read_sync("r1")
    reply = loaded.messages[-1]
    assert isinstance(reply, AssistantMessage)
    assert reply.calls[0].arguments == broken


def test_a_checkpoint_from_before_who_answered_loads() -> None:
    """A saved state with decisions and resolutions but no ``by``/``approvals_given`` loads."""
    written_before = (
        b'{"format":1,"run_id":"r1","task":"t","created_at":"2026-01-02T03:04:05Z",'
        b'"decisions":{"c1":{"approved":false,"reason":"no"}},'
        b'"resolutions":{"c2":{"step":3,"outcome":"done","detail":"decided"}}}'
    )
    state = decode_state(written_before)
    assert state.decisions["c1"] == Decision(approved=False, reason="no")
    assert state.decisions["c1"].by is None
    assert state.resolutions["c2"].by is None
    assert state.approvals_given == {}
    assert b"by" not in encode_state(state)  # and it saves back as it was


def test_a_newer_format_is_refused_as_too_new() -> None:
    """A state of a newer format than this code knows raises CheckpointTooNew naming both."""
    document = msgspec.json.decode(encode_state(state_b("r1")))
    document["format"] = FORMAT + 1
    with pytest.raises(durably.CheckpointTooNew) as caught:
        decode_state(msgspec.json.encode(document), path="/x/r1.json")
    assert (caught.value.found, caught.value.known) == (FORMAT + 1, FORMAT)
    assert "/x/r1.json" in str(caught.value)


def test_an_older_format_is_migrated(monkeypatch: pytest.MonkeyPatch) -> None:
    """A format-0 state goes through the registered migration and loads as the current format."""

    def from_format_0(document: dict[str, Any]) -> dict[str, Any]:
        document = dict(document)
        document["task"] = document.pop("title")
        document["format"] = 1
        return document

    monkeypatch.setitem(MIGRATIONS, 0, from_format_0)
    old = {"format": 0, "run_id": "r1", "title": "old task", "created_at": CREATED.isoformat()}
    state = decode_state(msgspec.json.encode(old))
    assert state == RunState(run_id="r1", task="old task", created_at=CREATED)


def test_an_older_format_without_a_migration_is_corrupt() -> None:
    """A format no migration starts from is CheckpointCorrupt, not a half-read state."""
    old = {"format": 0, "run_id": "r1", "task": "t", "created_at": CREATED.isoformat()}
    with pytest.raises(durably.CheckpointCorrupt, match="no migration from format 0"):
        decode_state(msgspec.json.encode(old), path="/x/r1.json")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("turns", "three"),
        ("phase", "sleeping"),
        ("messages", [{"type": "robot", "text": "hi"}]),
        ("created_at", "yesterday"),
        ("format", True),
        ("format", "1"),
        ("usage", {"input_tokens": -1.5}),
    ],
)
def test_a_wrong_typed_field_is_corrupt(field: str, value: object) -> None:
    """A field of the wrong type or value is CheckpointCorrupt naming the file."""
    document = msgspec.json.decode(encode_state(state_b("r1")))
    document[field] = value
    with pytest.raises(durably.CheckpointCorrupt) as caught:
        decode_state(msgspec.json.encode(document), path="/x/r1.json")
    assert caught.value.path == "/x/r1.json"


@pytest.mark.parametrize("data", [b"", b"not json", b"[1, 2]", b'"state"', b"{"])
def test_bytes_that_are_not_a_state_are_corrupt(data: bytes) -> None:
    """Bytes that are not a JSON object of a run state are CheckpointCorrupt."""
    with pytest.raises(durably.CheckpointCorrupt):
        decode_state(data)


def test_unanswered_lists_the_newest_reply_calls_without_a_result() -> None:
    """Only the newest reply's calls count, in the reply's order, minus those answered."""
    calls = tuple(ToolCall(id=f"c{n}", name="t", arguments="{}") for n in range(3))
    state = state_a("r1")
    state.messages += [
        AssistantMessage(calls=(ToolCall(id="old", name="t", arguments="{}"),)),
        AssistantMessage(calls=calls),
        ToolResult(call_id="c1", name="t", content="ok"),
    ]
    assert state.last_reply() == state.messages[-2]
    assert list(state.answered()) == ["c1"]
    assert [call.id for call in state.unanswered()] == ["c0", "c2"]


def test_a_state_before_any_reply_has_nothing_unanswered() -> None:
    """A run with only its task has no last reply and no unanswered calls."""
    state = state_a("r1")
    assert state.last_reply() is None
    assert state.unanswered() == []
