"""The run state: everything a later process needs to carry a run on.

Records are msgspec Structs encoded as JSON with defaults omitted, so an unset
field stays absent on disk and loads as absent (never as an empty value a
provider client would send back). Tool-call arguments are kept as the raw string
the model produced: a run whose model emitted invalid JSON must still save.

The format is versioned. ``FORMAT`` is the newest this code writes;
:func:`decode_state` migrates older formats step by step and refuses newer ones.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import msgspec

from .errors import CheckpointCorrupt, CheckpointTooNew

__all__ = [
    "FORMAT",
    "LADDER_STEPS",
    "Approval",
    "ApprovalKind",
    "AssistantMessage",
    "AttemptMarker",
    "Decision",
    "Effect",
    "Fingerprint",
    "Message",
    "ModelCall",
    "Phase",
    "Resolution",
    "ResolutionOutcome",
    "RunState",
    "ToolCall",
    "ToolPrint",
    "ToolResult",
    "Usage",
    "UserMessage",
    "check_ranges",
    "decode_state",
    "encode_state",
    "utcnow",
]

FORMAT = 1
"""The newest state format this code reads and writes."""


def utcnow() -> datetime:
    """The current time, timezone-aware in UTC."""
    return datetime.now(UTC)


def age(when: datetime | None) -> str:
    """How long ago ``when`` was, for people (``-`` when unknown): ``42s ago``, ``3m ago``."""
    if when is None:
        return "-"
    seconds = int((utcnow() - when).total_seconds())
    if seconds < 120:
        return f"{seconds}s ago"
    if seconds < 7200:
        return f"{seconds // 60}m ago"
    return f"{seconds // 3600}h ago"


class Phase(enum.StrEnum):
    """The loop's next move. Values are stable on disk."""

    MODEL = "model"
    TOOLS = "tools"
    PAUSED = "paused"
    DONE = "done"
    CANCELLED = "cancelled"
    """Stopped by ``durably cancel``: finished, never resumed, like ``done`` without an answer."""

    @property
    def finished(self) -> bool:
        """Whether a run in this phase is over (``done`` or ``cancelled``): nothing more runs."""
        return self is Phase.DONE or self is Phase.CANCELLED


class Effect(enum.StrEnum):
    """What a tool does to the world, which decides how an in-doubt call is resolved."""

    READ = "read"
    """Only reads; rerun freely, no attempt marker."""
    IDEMPOTENT = "idempotent"
    """A repeat is harmless (an overwrite with the same content); rerun."""
    KEYED = "keyed"
    """Sends the idempotency key and the service deduplicates; rerun while the key is live."""
    WRITE = "write"
    """Changes something with no key; a crash leaves it to the lookup or a person."""


class ApprovalKind(enum.StrEnum):
    """What a question to a person asks. Values are stable on disk."""

    APPROVE = "approve"
    """May this call run?"""
    RESOLVE = "resolve"
    """Did this in-doubt call happen?"""


class ResolutionOutcome(enum.StrEnum):
    """How an in-doubt call was settled. Values are stable on disk."""

    RERUN = "rerun"
    FOUND = "found"
    NOT_FOUND = "not-found"
    DONE = "done"
    """A person supplied the result."""


class Usage(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True):
    """Tokens a model call (or a whole run) consumed."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
        )

    @property
    def total_tokens(self) -> int:
        """Every token counted, in and out."""
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_read_tokens
            + self.cache_write_tokens
        )


class ToolCall(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True):
    """One tool call in a model reply."""

    id: str
    """The model's call ID, unique within the run."""
    name: str
    arguments: str
    """The raw argument string the model produced; parsed only when the tool runs."""


class UserMessage(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True, tag="user"):
    """A message from the user: the task, or a note the harness adds."""

    text: str


class AssistantMessage(
    msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True, tag="assistant"
):
    """One model reply, saved before any of its calls runs (save point 2)."""

    text: str | None = None
    calls: tuple[ToolCall, ...] = ()
    usage: Usage = Usage()
    dollars: float = 0.0
    model: str | None = None
    """The model that produced the reply, as the provider named it."""
    turn: int = 0
    """The turn this reply answered, counting from 1."""


class ToolResult(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True, tag="tool"):
    """The answer to one tool call, as the model will see it."""

    call_id: str
    name: str
    content: str
    is_error: bool = False


Message = UserMessage | AssistantMessage | ToolResult


class AttemptMarker(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True):
    """Saved just before a call that can change something: "this call may have acted"."""

    key: str
    """The call's idempotency key."""
    tool: str
    started_at: datetime
    intended: dict[str, str] = {}
    """Workspace path -> SHA-256 each file will have if the call completes."""


class ModelCall(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True):
    """Saved just before a model call: "the provider may be paid for this turn".

    The reply's save clears it. Found on resume, it stands for a reply paid for
    and lost before its save, whose worst case then counts towards the budget.
    """

    turn: int
    """The turn asked for."""
    model: str
    asked_at: datetime
    messages: int
    """How many messages the request carried (after the summary)."""
    worst_dollars: float
    """The most the call could cost, priced before it was made."""
    worst_usage: Usage = Usage()
    """The token bound that price was computed from."""


class Approval(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True):
    """A call waiting for a person's decision."""

    call_id: str
    tool: str
    arguments: str
    asked_at: datetime
    kind: ApprovalKind = ApprovalKind.APPROVE
    """``approve`` (may it run?) or ``resolve`` (did this in-doubt call happen?)."""
    why: str | None = None
    """For ``resolve``: why the ladder could not decide by itself."""


class Decision(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True):
    """A person's (or policy's) answer to an approval question."""

    approved: bool
    reason: str | None = None
    decided_at: datetime | None = None
    by: str | None = None
    """Who answered: the approver's name, ``<user> (durably answer)``, ``console``;
    None when unknown (``resume(decisions=...)``, a checkpoint older than the field)."""


LADDER_STEPS: dict[int, str] = {1: "rerun (harmless)", 2: "lookup", 3: "a person"}
"""What each step of :attr:`Resolution.step` is called where a verdict is shown."""


class Resolution(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True):
    """How the ladder resolved one in-doubt call."""

    step: int
    """1 = rerun, 2 = lookup, 3 = a person."""
    outcome: ResolutionOutcome
    """``rerun``, ``found``, ``not-found``, ``done`` (a person supplied the result)."""
    detail: str | None = None
    by: str | None = None
    """For step 3, who answered (as ``Decision.by``); None for steps 1 and 2 and when unknown."""


class ToolPrint(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True):
    """What a tool was when the run started: enough to notice a changed meaning."""

    name: str
    effect: Effect
    schema_sha256: str
    needs_approval: bool = False


class Fingerprint(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True):
    """What the run was started with; resuming with something else is ``AgentChanged``."""

    model: str
    system_sha256: str
    tools: tuple[ToolPrint, ...] = ()


class RunState(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Everything a later process needs to carry a run on."""

    format: int = msgspec.field(default_factory=lambda: FORMAT)
    """Written in every checkpoint (a factory default is never omitted), so a later
    durably can tell which format it reads."""
    run_id: str
    task: str
    created_at: datetime
    phase: Phase = Phase.MODEL
    messages: list[Message] = []
    """The conversation after the summary: user, assistant replies, tool results."""
    summary: str | None = None
    """The context policy's summary of history dropped from ``messages``."""
    summarized: int = 0
    """How many messages the summary replaced."""
    usage: Usage = Usage()
    """Tokens used over the run's whole life, across every process."""
    dollars: float = 0.0
    """What the saved replies cost."""
    unsaved_dollars: float = 0.0
    """Worst-case price of model calls whose reply was lost before its save (counted on
    resume from an unmatched ``model_call``); the budget covers ``dollars`` plus this."""
    unsaved_replies: int = 0
    """How many replies were lost before their save (each counted in ``unsaved_dollars``)."""
    max_dollars: float | None = None
    """The dollar limit (``Limits.max_dollars``) of the last process that ran the run, kept
    for people (the console draws it); None: no limit, or saved before the field. The loop
    enforces the limit it runs with, never this record of it."""
    model_call: ModelCall | None = None
    """The model call in flight: saved before the call, cleared by the reply's save."""
    turns: int = 0
    """Model replies saved so far."""
    resumes: int = 0
    """Times the run was opened for resume."""
    answered_at: datetime | None = None
    """When a person's answer was saved outside the loop (``durably answer``, the console);
    the next open acts on it and is not a restart. Cleared, and saved, by that open."""
    pending: dict[str, Approval] = {}
    """Calls waiting for a person, by call ID."""
    decisions: dict[str, Decision] = {}
    """Approval decisions already made for the current reply, by call ID."""
    approvals_given: dict[str, Decision] = {}
    """Every approval decision of the run, by call ID; kept for the run's life (the
    timeline shows it after ``decisions`` is cleared). Saved with what the decision led to."""
    markers: dict[str, AttemptMarker] = {}
    """Attempt markers of calls that may have acted, by call ID."""
    resolutions: dict[str, Resolution] = {}
    """How the ladder settled in-doubt calls, by call ID; kept for the run's life."""
    workspace: dict[str, str] = {}
    """Path -> SHA-256 of every file the run wrote."""
    paused_with: dict[str, Any] | None = None
    """A framework's own record of the pause, when it pauses itself: the OpenAI Agents
    SDK's ``RunState.to_json()`` at its interruption (``durably.openai_agents``). Saved
    with the pause (save point 5), cleared when the run asks the model again."""
    fingerprint: Fingerprint | None = None
    answer: str | None = None
    stop_reason: str | None = None
    """Why the run stopped: ``answered``, ``cancelled``, or the limit or error that stopped it."""
    saved_at: datetime | None = None
    """When the state was last saved; set by the store."""

    @property
    def spent(self) -> float:
        """Every dollar counted: the saved replies and the worst case of those lost."""
        return self.dollars + self.unsaved_dollars

    def last_reply(self) -> AssistantMessage | None:
        """The newest model reply, or None before the first."""
        for message in reversed(self.messages):
            if isinstance(message, AssistantMessage):
                return message
        return None

    def answered(self) -> dict[str, ToolResult]:
        """Results already given to the newest reply's calls, by call ID."""
        results: dict[str, ToolResult] = {}
        for message in reversed(self.messages):
            if isinstance(message, AssistantMessage):
                break
            if isinstance(message, ToolResult):
                results[message.call_id] = message
        return results

    def unanswered(self) -> list[ToolCall]:
        """The newest reply's calls that have no result yet, in the reply's order."""
        reply = self.last_reply()
        if reply is None:
            return []
        done = self.answered()
        return [call for call in reply.calls if call.id not in done]

    def cancel(self) -> None:
        """End the run as ``cancelled`` (``durably cancel``): finished, never resumed.

        Its open questions go (nobody need answer them); a model call left in flight
        by a process that died is counted at its worst case, as a restart counts it;
        attempt markers stay, the record of calls that may have acted.
        """
        lost = self.model_call
        if lost is not None:
            self.unsaved_dollars += lost.worst_dollars
            self.unsaved_replies += 1
            self.model_call = None
        self.phase = Phase.CANCELLED
        self.stop_reason = "cancelled"
        self.pending.clear()
        self.decisions.clear()


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(RunState)
_probe = msgspec.json.Decoder(dict[str, Any])

Migration = Callable[[dict[str, Any]], dict[str, Any]]

MIGRATIONS: dict[int, Migration] = {}
"""Format N -> a function turning a decoded format-N document into format N+1."""


def encode_state(state: RunState) -> bytes:
    """Encode a state as compact JSON with defaults omitted."""
    return _encoder.encode(state)


def decode_state(data: bytes | memoryview, *, path: str = "<memory>") -> RunState:
    """Decode a state, migrating older formats and refusing newer ones.

    Raises:
        CheckpointCorrupt: the bytes are not a run state.
        CheckpointTooNew: the state was written by a newer durably.
    """
    try:
        return check_ranges(_decode_current(data), path=path)
    except msgspec.ValidationError as exc:
        first_error: Exception = exc
    except msgspec.DecodeError as exc:
        raise CheckpointCorrupt(path=path, reason=f"not JSON: {exc}") from exc
    except RecursionError as exc:
        raise CheckpointCorrupt(path=path, reason="JSON nested too deeply") from exc
    # The strict decoder refused it: find out whether it is an older or newer format.
    try:
        document = _probe.decode(data)
    except msgspec.DecodeError as exc:
        raise CheckpointCorrupt(path=path, reason=f"not a JSON object: {exc}") from exc
    except RecursionError as exc:
        raise CheckpointCorrupt(path=path, reason="JSON nested too deeply") from exc
    found = document.get("format", FORMAT)
    if not isinstance(found, int) or isinstance(found, bool):
        raise CheckpointCorrupt(path=path, reason=f"format is {found!r}, not an integer")
    if found > FORMAT:
        raise CheckpointTooNew(path=path, found=found, known=FORMAT)
    if found == FORMAT:
        raise CheckpointCorrupt(path=path, reason=str(first_error)) from first_error
    return migrate(document, path=path)


def migrate(document: dict[str, Any], *, path: str = "<memory>") -> RunState:
    """Bring a decoded document of an older format up to ``FORMAT``."""
    found = document.get("format", FORMAT)
    while found < FORMAT:
        step = MIGRATIONS.get(found)
        if step is None:
            raise CheckpointCorrupt(path=path, reason=f"no migration from format {found}")
        document = step(document)
        found = document["format"]
    try:
        return check_ranges(msgspec.convert(document, RunState), path=path)
    except msgspec.ValidationError as exc:
        raise CheckpointCorrupt(path=path, reason=f"after migration: {exc}") from exc


def _decode_current(data: bytes | memoryview) -> RunState:
    state = _decoder.decode(data)
    if state.format != FORMAT:
        # A document of another format may still parse; send it down the slow path.
        raise msgspec.ValidationError(f"format {state.format}")
    return state


def check_ranges(state: RunState, *, path: str = "<memory>") -> RunState:
    """Refuse counts and amounts no run can have saved; return ``state``.

    A checksum proves the bytes are the ones written, not that they are sane: a
    forged or hand-edited checkpoint with ``resumes: -1000`` would lift the resume
    limit, a negative ``dollars`` the budget. Checked on every load.

    Raises:
        CheckpointCorrupt: naming the field and its value.
    """
    counts = {
        "turns": state.turns,
        "resumes": state.resumes,
        "summarized": state.summarized,
        **{f"usage.{name}": getattr(state.usage, name) for name in state.usage.__struct_fields__},
    }
    amounts = {"dollars": state.dollars}
    for index, message in enumerate(state.messages):
        if isinstance(message, AssistantMessage):
            amounts[f"messages[{index}].dollars"] = message.dollars
            counts[f"messages[{index}].turn"] = message.turn
            for name in message.usage.__struct_fields__:
                counts[f"messages[{index}].usage.{name}"] = getattr(message.usage, name)
    for name, value in counts.items():
        if value < 0:
            raise CheckpointCorrupt(path=path, reason=f"{name} is {value}, below zero")
    for name, amount in amounts.items():
        if not amount >= 0.0 or amount == float("inf"):  # also refuses NaN
            raise CheckpointCorrupt(path=path, reason=f"{name} is {amount}, not a sum spent")
    limit = state.max_dollars
    if limit is not None and not 0.0 < limit < float("inf"):  # as Limits refuses it
        raise CheckpointCorrupt(path=path, reason=f"max_dollars is {limit}, not a dollar limit")
    return state
