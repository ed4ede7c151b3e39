"""What the demo's issue tracker answers with: the records it returns and the errors it raises.

The tracker itself (:class:`durably.triage.tracker.Tracker`, which re-exports every
name here) is the SQLite machinery; this module is its vocabulary, shared by the
tracker, its tools and the sweep's checks. Records are frozen msgspec Structs of
strings and ints, ready to become a tool's text result (``msgspec.json.encode``);
the errors pickle with their fields, for a forked sweep child to report them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Literal

import msgspec

from ..errors import FieldsPickle

__all__ = [
    "AlreadyFiled",
    "Clock",
    "Comment",
    "EffectRecord",
    "FiledIssue",
    "InvalidRequest",
    "Issue",
    "IssueNotFound",
    "IssueSummary",
    "KeyConflict",
    "MovableClock",
    "Operation",
    "Outcome",
    "Request",
    "TrackerError",
    "normalize_cause",
]

Clock = Callable[[], datetime]
"""A callable returning the current time as an aware datetime."""

Operation = Literal["file_issue", "comment"]
Outcome = Literal[
    "created", "replayed", "key_conflict", "already_filed", "issue_not_found", "invalid"
]


_SLUG = re.compile(r"[^a-z0-9]+")

# -- errors -------------------------------------------------------------------


class TrackerError(FieldsPickle, Exception):
    """Root of the errors the tracker answers with; a tool shows the message to the model."""


class InvalidRequest(TrackerError):
    """Raised for a malformed request (an empty cause, an empty key); fix the arguments."""


class KeyConflict(TrackerError):
    """Raised when an idempotency key is reused with different arguments; use a new key."""

    def __init__(self, *, key: str, operation: str) -> None:
        super().__init__(
            f"idempotency key {key!r} was already used for a different {operation} request; "
            "a key names one request: send a new key for new arguments"
        )
        self.key = key
        self.operation = operation


class AlreadyFiled(TrackerError):
    """Raised when an issue for the cause exists already; comment on that issue instead."""

    def __init__(self, *, number: int, cause: str) -> None:
        super().__init__(
            f"an issue for cause {cause!r} is already filed as #{number}; "
            f"comment on #{number} instead of filing it again"
        )
        self.number = number
        self.cause = cause


class IssueNotFound(TrackerError):
    """Raised for an issue number the tracker does not hold; check the number."""

    def __init__(self, *, number: int) -> None:
        super().__init__(f"there is no issue #{number}")
        self.number = number


# -- records ------------------------------------------------------------------


class FiledIssue(msgspec.Struct, frozen=True, kw_only=True):
    """The tracker's answer to a filing."""

    number: int
    title: str
    cause: str
    """The cause as the tracker normalised it (a lower-case slug)."""
    reports: tuple[str, ...]
    key: str | None
    created: str
    """ISO 8601 time of the filing, UTC."""
    replayed: bool = False
    """True when this is the stored answer to an earlier request with the same key."""


class Comment(msgspec.Struct, frozen=True, kw_only=True):
    """A comment on an issue, as created or listed."""

    id: int
    issue: int
    body: str
    key: str | None
    created: str
    replayed: bool = False
    """True when this is the stored answer to an earlier request with the same key."""


class Issue(msgspec.Struct, frozen=True, kw_only=True):
    """An issue as the tracker holds it."""

    number: int
    title: str
    body: str
    cause: str
    reports: tuple[str, ...]
    key: str | None
    """The idempotency key the filing carried, recorded even when keys are not honoured."""
    created: str


class IssueSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One search hit."""

    number: int
    title: str
    cause: str


class EffectRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One change the tracker made: an issue filed or a comment added."""

    seq: int
    kind: Literal["issue", "comment"]
    target: int
    """The issue filed, or the issue commented on."""
    id: int
    """The issue's number or the comment's id."""
    key: str | None
    time: str


class Request(msgspec.Struct, frozen=True, kw_only=True):
    """One write request the tracker received, whatever became of it."""

    seq: int
    operation: Operation
    key: str | None
    outcome: Outcome
    target: int | None
    """The issue the request created, replayed, commented on or collided with, if any."""
    time: str


# -- clock ----------------------------------------------------------------------


class MovableClock:
    """A clock that stands still until a test moves it.

    Args:
        start: the time it shows first (aware); 2026-03-02 09:00 UTC if not given.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
        if self._now.tzinfo is None:
            raise ValueError("MovableClock needs an aware datetime")

    def __call__(self) -> datetime:
        """The time it shows."""
        return self._now

    def advance(self, delta: timedelta) -> datetime:
        """Move the clock forward by ``delta``; return the new time."""
        self._now += delta
        return self._now


def normalize_cause(cause: str) -> str:
    """A cause as the refile guard compares it: a lower-case slug.

    ``"Done After Delete"`` and ``"done_after_delete"`` both become ``"done-after-delete"``.
    """
    return _SLUG.sub("-", cause.lower()).strip("-")
