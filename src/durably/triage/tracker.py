"""The issue tracker the triage agent files into: a real receiver over SQLite.

It plays the part of a remote service (GitHub Issues, Jira) with the behaviour
exactly-once delivery depends on, so the sweep can count at the receiver what a
crash did:

- **Idempotency keys**, with Stripe's semantics: a repeat with the same key and
  the same arguments returns the first response, marked as replayed, and does
  nothing; the same key with different arguments is refused with
  :class:`KeyConflict`; a key older than the tracker's ``key_ttl`` no longer
  matches and counts as no key. A tracker built with ``honour_keys=False``
  records the key it was sent but does not deduplicate by it. The keys are the
  receiver code durably ships (:class:`durably.receivers.KeyTable`), kept in the
  tracker's own database: the claim, the write and the key's result commit in
  one transaction, so the sweep's duplicate count is a count of that code.
- **The refile guard**, a business rule of the tracker itself: a second filing
  for a cause that already has an issue is refused with :class:`AlreadyFiled`,
  naming the existing issue, whether or not keys are honoured. A tracker built
  with ``refile_guard=False`` files it again (the sweep's "no refile guard"
  configuration: a write run twice then shows as a duplicate issue).
- **A lookup by key** (:meth:`Tracker.lookup`) and a **search** by content
  (:meth:`Tracker.search`), for the resolution ladder's second step.
- **An audit trail**: every effect performed (:meth:`Tracker.effects`) and every
  request received with its key and outcome (:meth:`Tracker.requests`), so a
  check can count duplicates and verify that every write carried a key.

Every operation opens its own connection and runs in one ``BEGIN IMMEDIATE``
transaction, in WAL mode with ``synchronous=FULL``: any number of processes can
share the database, a connection never crosses a ``fork``, and an answer is
durable before it is returned. Its answers and errors (frozen msgspec Structs,
ready to become a tool's text result) are defined in
:mod:`durably.triage.tracker_types` and re-exported here.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, TypeVar

import msgspec

from ..receivers import Claimed, KeyRecord, KeyTable, Mismatch, Replay, StoredOutcome
from .tracker_types import (
    AlreadyFiled,
    Clock,
    Comment,
    EffectRecord,
    FiledIssue,
    InvalidRequest,
    Issue,
    IssueNotFound,
    IssueSummary,
    KeyConflict,
    MovableClock,
    Operation,
    Outcome,
    Request,
    TrackerError,
    normalize_cause,
)

__all__ = [
    "DEFAULT_KEY_TTL",
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
    "Request",
    "Tracker",
    "TrackerError",
    "normalize_cause",
]

DEFAULT_KEY_TTL = timedelta(hours=24)
"""How long the tracker remembers an idempotency key unless told otherwise (Stripe's 24 hours)."""

_SCHEMA_VERSION = 2
"""2: the keys in durably.receivers' table (1 had a table of its own, ``idempotency_keys``)."""
_BUSY_TIMEOUT_MS = 30_000
_MAX_KEY_LENGTH = 255
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS issues (
        number INTEGER PRIMARY KEY AUTOINCREMENT,
        title TEXT NOT NULL,
        body TEXT NOT NULL,
        cause TEXT NOT NULL,
        reports TEXT NOT NULL,
        key TEXT,
        created TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS comments (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        issue INTEGER NOT NULL REFERENCES issues(number),
        body TEXT NOT NULL,
        key TEXT,
        created TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS effects (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL,
        target INTEGER NOT NULL,
        id INTEGER NOT NULL,
        key TEXT,
        time TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS requests (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        operation TEXT NOT NULL,
        key TEXT,
        outcome TEXT NOT NULL,
        target INTEGER,
        time TEXT NOT NULL)""",
)


# -- clock ----------------------------------------------------------------------


_inherited: list[sqlite3.Connection] = []
"""Read connections a forked child inherited: kept referenced so they are never closed there."""


def _system_clock() -> datetime:
    return datetime.now(UTC)


# -- the tracker ----------------------------------------------------------------


class Tracker:
    """An issue tracker with its own SQLite database, shared safely by many processes.

    Args:
        path: the database file, created with its schema if missing.
        honour_keys: deduplicate by idempotency key. When False the tracker still
            records each request's key, but a repeat acts again.
        key_ttl: how long a key is remembered for deduplication.
        clock: the tracker's idea of now; the system clock (UTC) if not given.
        refile_guard: refuse a second filing for a cause (:class:`AlreadyFiled`).
            The guard is this rule, checked in the filing's transaction; without
            it a cause can have several issues.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        honour_keys: bool = True,
        key_ttl: timedelta = DEFAULT_KEY_TTL,
        clock: Clock | None = None,
        sync: bool = True,
        refile_guard: bool = True,
    ) -> None:
        self.path = Path(path)
        self.refile_guard = refile_guard
        self.sync = sync
        """``synchronous=FULL`` (survives a power cut); off only where a test kills processes."""
        self.honour_keys = honour_keys
        self.key_ttl = key_ttl
        self._clock = clock or _system_clock
        self._reader: sqlite3.Connection | None = None
        self._reader_pid = 0
        self._reader_lock = threading.Lock()
        with self._reading() as connection:
            (version,) = connection.execute("PRAGMA user_version").fetchone()
            if version == _SCHEMA_VERSION:
                return  # made by an earlier open: WAL and the schema are in the file
            # WAL is a property of the file: set once, kept by every later connection.
            # Switching to it can answer SQLITE_BUSY without waiting on the busy
            # handler while another process creates the same database: try again.
            for attempt in range(200):
                try:
                    connection.execute("PRAGMA journal_mode=WAL")
                    break
                except sqlite3.OperationalError as exc:
                    if "locked" not in str(exc) or attempt == 199:
                        raise
                    time.sleep(0.01)
            with self._transaction(connection):
                for statement in _SCHEMA:
                    connection.execute(statement)
                KeyTable(connection).create()
                connection.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")

    def __repr__(self) -> str:
        return f"Tracker({str(self.path)!r}, honour_keys={self.honour_keys})"

    def close(self) -> None:
        """Close this process's read connection (the tracker opens a new one if read again)."""
        with self._reader_lock:
            if self._reader is not None and self._reader_pid == os.getpid():
                self._reader.close()
            self._reader = None

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- writes -----------------------------------------------------------------

    def file_issue(
        self, *, title: str, body: str, cause: str, reports: Sequence[str], key: str | None
    ) -> FiledIssue:
        """File an issue for one root cause.

        Args:
            title: one line.
            body: the description: what crashes, why, which reports.
            cause: a short name of the root cause; normalised to a lower-case slug.
            reports: the IDs of the crash reports the issue covers.
            key: the idempotency key, or None to send none.

        Returns:
            The new issue, or the stored answer to the same request made earlier
            with the same key (``replayed=True``).

        Raises:
            KeyConflict: the key was used for a different request.
            AlreadyFiled: an issue for this cause exists (names its number).
            InvalidRequest: the cause is empty or the key malformed.
        """
        arguments = {"title": title, "body": body, "cause": cause, "reports": list(reports)}

        def act(connection: sqlite3.Connection, now: str, log: _Log) -> FiledIssue:
            slug = normalize_cause(cause)
            if not slug:
                log("invalid", None)
                raise InvalidRequest("the cause must contain a letter or digit")
            existing = connection.execute(
                "SELECT number FROM issues WHERE cause = ?", (slug,)
            ).fetchone()
            if existing is not None and self.refile_guard:
                log("already_filed", existing[0])
                raise AlreadyFiled(number=existing[0], cause=slug)
            cursor = connection.execute(
                "INSERT INTO issues (title, body, cause, reports, key, created) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (title, body, slug, json.dumps(list(reports)), key, now),
            )
            number = _rowid(cursor)
            _record_effect(connection, kind="issue", target=number, id_=number, key=key, now=now)
            log("created", number)
            return FiledIssue(
                number=number, title=title, cause=slug, reports=tuple(reports), key=key, created=now
            )

        return self._write("file_issue", key, arguments, FiledIssue, act)

    def comment(self, *, number: int, body: str, key: str | None) -> Comment:
        """Add a comment to an issue. There is no guard against saying the same thing twice.

        Args:
            number: the issue to comment on.
            body: the comment's text.
            key: the idempotency key, or None to send none.

        Returns:
            The new comment, or the stored answer to the same request made earlier
            with the same key (``replayed=True``).

        Raises:
            KeyConflict: the key was used for a different request.
            IssueNotFound: there is no issue with this number.
        """
        arguments = {"number": number, "body": body}

        def act(connection: sqlite3.Connection, now: str, log: _Log) -> Comment:
            found = connection.execute(
                "SELECT 1 FROM issues WHERE number = ?", (number,)
            ).fetchone()
            if found is None:
                log("issue_not_found", number)
                raise IssueNotFound(number=number)
            cursor = connection.execute(
                "INSERT INTO comments (issue, body, key, created) VALUES (?, ?, ?, ?)",
                (number, body, key, now),
            )
            comment_id = _rowid(cursor)
            _record_effect(
                connection, kind="comment", target=number, id_=comment_id, key=key, now=now
            )
            log("created", number)
            return Comment(id=comment_id, issue=number, body=body, key=key, created=now)

        return self._write("comment", key, arguments, Comment, act)

    # -- reads ------------------------------------------------------------------

    def lookup(self, key: str) -> dict[str, Any] | None:
        """Was a request with this key processed, and what was the answer?

        A lookup is a search of the tracker's records, not a deduplication: it
        returns the stored answer while the key's record exists, even after the
        key has outlived ``key_ttl`` and no longer deduplicates. Records are only
        dropped by :meth:`purge_expired`, or replaced when an expired key is sent
        again. A tracker that does not honour keys keeps no key records, so its
        lookups find nothing.

        Args:
            key: the idempotency key.

        Returns:
            The first answer as a dict (the fields of :class:`FiledIssue` or
            :class:`Comment`, plus ``"kind"``: ``"issue"`` or ``"comment"``), or
            None when the tracker holds no record of the key.
        """
        with self._reading() as connection:
            # A search of the records, not a deduplication: read with no TTL.
            record = KeyTable(connection, ttl=timedelta.max, clock=self._now).record(key)
        if not isinstance(record.result, StoredOutcome):
            return None
        answer: dict[str, Any] = record.result.value
        return answer

    def search(self, query: str) -> list[IssueSummary]:
        """Issues whose title, body or cause contains ``query``, ignoring case, oldest first."""
        needle = query.casefold()
        return [
            IssueSummary(number=issue.number, title=issue.title, cause=issue.cause)
            for issue in self.issues()
            if needle in issue.title.casefold()
            or needle in issue.body.casefold()
            or needle in issue.cause.casefold()
        ]

    def issues(self) -> list[Issue]:
        """Every issue, oldest first."""
        with self._reading() as connection:
            rows = connection.execute(
                "SELECT number, title, body, cause, reports, key, created FROM issues "
                "ORDER BY number"
            ).fetchall()
        return [_issue(row) for row in rows]

    def get(self, number: int) -> Issue:
        """The issue with this number.

        Raises:
            IssueNotFound: there is none.
        """
        with self._reading() as connection:
            row = connection.execute(
                "SELECT number, title, body, cause, reports, key, created FROM issues "
                "WHERE number = ?",
                (number,),
            ).fetchone()
        if row is None:
            raise IssueNotFound(number=number)
        return _issue(row)

    def comments(self, number: int | None = None) -> list[Comment]:
        """Every comment, oldest first; only those on issue ``number`` if given."""
        sql = "SELECT id, issue, body, key, created FROM comments"
        parameters: tuple[int, ...] = ()
        if number is not None:
            sql += " WHERE issue = ?"
            parameters = (number,)
        with self._reading() as connection:
            rows = connection.execute(sql + " ORDER BY id", parameters).fetchall()
        return [
            Comment(id=row[0], issue=row[1], body=row[2], key=row[3], created=row[4])
            for row in rows
        ]

    def effects(self) -> list[EffectRecord]:
        """Every change the tracker made, in order: what a duplicate count is taken from."""
        with self._reading() as connection:
            rows = connection.execute(
                "SELECT seq, kind, target, id, key, time FROM effects ORDER BY seq"
            ).fetchall()
        return [
            EffectRecord(seq=row[0], kind=row[1], target=row[2], id=row[3], key=row[4], time=row[5])
            for row in rows
        ]

    def requests(self) -> list[Request]:
        """Every write request received, in order, with its key and outcome.

        Refused and replayed requests are listed too, so a check can verify that
        every write carried a key.
        """
        with self._reading() as connection:
            rows = connection.execute(
                "SELECT seq, operation, key, outcome, target, time FROM requests ORDER BY seq"
            ).fetchall()
        return [
            Request(
                seq=row[0], operation=row[1], key=row[2], outcome=row[3], target=row[4], time=row[5]
            )
            for row in rows
        ]

    def purge_expired(self) -> int:
        """Forget key records older than ``key_ttl``, as a real service eventually does.

        Returns:
            How many records were dropped.
        """
        with closing(self._connect()) as connection, self._transaction(connection):
            return self._keys(connection).forget_expired()

    # -- machinery --------------------------------------------------------------

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """The connection for a read: one per tracker and process, kept between reads.

        Opening a connection costs a file open and two statements, and closing
        the last one checkpoints and deletes the write-ahead log; the crash
        sweep's judge reads a tracker a dozen times per scenario. Outside a
        transaction each SELECT sees every write committed before it. A
        connection inherited through a fork is left alone (SQLite forbids using
        it in the child, and closing it there could delete the parent's log).
        """
        with self._reader_lock:
            if self._reader is None or self._reader_pid != os.getpid():
                if self._reader is not None:
                    _inherited.append(self._reader)
                self._reader = self._connect(check_same_thread=False)
                self._reader_pid = os.getpid()
            yield self._reader

    def _connect(self, *, check_same_thread: bool = True) -> sqlite3.Connection:
        connection = sqlite3.connect(
            # The timeout is SQLite's busy timeout: a locked database is waited for.
            self.path,
            timeout=_BUSY_TIMEOUT_MS / 1000,
            isolation_level=None,
            check_same_thread=check_same_thread,
        )
        connection.execute(f"PRAGMA synchronous = {'FULL' if self.sync else 'OFF'}")
        connection.execute("PRAGMA foreign_keys = ON")
        return connection

    @staticmethod
    @contextmanager
    def _transaction(connection: sqlite3.Connection) -> Iterator[None]:
        # IMMEDIATE takes the write lock at the start, so two processes never
        # both pass the refile guard or the key check before either writes.
        connection.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")

    def _now(self) -> datetime:
        now = self._clock()
        if now.tzinfo is None:
            raise ValueError("the tracker's clock must return an aware datetime")
        return now.astimezone(UTC)

    def _write(  # noqa: C901 - the fake tracker's write path: key, refile guard, faults, in order
        self,
        operation: Operation,
        key: str | None,
        arguments: dict[str, Any],
        answer_type: type[_Answer],
        act: Callable[[sqlite3.Connection, str, _Log], _Answer],
    ) -> _Answer:
        """Run one write in one transaction: the key's claim, then ``act``, then the key's result.

        A replay or a key conflict never reaches ``act``. The request is logged in
        the same transaction whatever the outcome; a refusal (a :class:`TrackerError`
        raised by ``act``) gives the key back (its claim is rolled back to a savepoint)
        and is committed, then raised.
        """
        if key is not None and not 0 < len(key) <= _MAX_KEY_LENGTH:
            raise InvalidRequest(f"an idempotency key has 1 to {_MAX_KEY_LENGTH} characters")
        now = self._now().isoformat()
        answer: _Answer | None = None
        refusal: TrackerError | None = None
        logged: list[tuple[Outcome, int | None]] = []

        def log(outcome: Outcome, target: int | None) -> None:
            logged.append((outcome, target))

        with closing(self._connect()) as connection, self._transaction(connection):
            keys = self._keys(connection) if self.honour_keys and key is not None else None
            claim = None
            if keys is not None and key is not None:
                connection.execute("SAVEPOINT claim")
                claim = keys.claim(key, _fingerprint(operation, arguments))
            if isinstance(claim, Mismatch) and keys is not None:
                log("key_conflict", None)
                refusal = KeyConflict(key=str(key), operation=_operation(keys.record(str(key))))
            elif isinstance(claim, Replay) and isinstance(claim.result, StoredOutcome):
                fields = {name: v for name, v in claim.result.value.items() if name != "kind"}
                answer = msgspec.convert({**fields, "replayed": True}, answer_type)
                log("replayed", _target(answer))
            elif claim is None or isinstance(claim, Claimed):
                try:
                    answer = act(connection, now, log)
                except TrackerError as exc:
                    refusal = exc
                    if claim is not None:
                        connection.execute("ROLLBACK TO claim")  # the key stays unclaimed
                else:
                    if keys is not None and claim is not None:
                        keys.finish(claim, StoredOutcome(value=_response(answer)))
            else:  # pragma: no cover - a claim and its finish share one transaction
                raise TrackerError(f"internal error: key {key!r} holds an unfinished write")
            if claim is not None:
                connection.execute("RELEASE claim")
            for outcome, target in logged:
                connection.execute(
                    "INSERT INTO requests (operation, key, outcome, target, time) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (operation, key, outcome, target, now),
                )
        if refusal is not None:
            raise refusal
        if answer is None:  # pragma: no cover - every branch above sets one of the two
            raise TrackerError("internal error: a write produced no answer")
        return answer

    def _keys(self, connection: sqlite3.Connection) -> KeyTable:
        """The tracker's idempotency keys: durably's receiver table, in the tracker's database."""
        return KeyTable(connection, ttl=self.key_ttl, clock=self._now)


_Answer = TypeVar("_Answer", FiledIssue, Comment)
_Log = Callable[[Outcome, "int | None"], None]
"""Logs the request being handled with its outcome and target issue."""


def _fingerprint(operation: str, arguments: dict[str, Any]) -> str:
    """What "the same arguments" means: SHA-256 of the operation and arguments as canonical JSON."""
    canonical = json.dumps([operation, arguments], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _response(answer: FiledIssue | Comment) -> dict[str, Any]:
    """The answer a key keeps: its fields and ``kind``, as :meth:`Tracker.lookup` gives it."""
    kind = "issue" if isinstance(answer, FiledIssue) else "comment"
    return {"kind": kind, **msgspec.to_builtins(answer)}


def _operation(record: KeyRecord) -> str:
    """The operation a key was first used for, named in a :class:`KeyConflict`."""
    result = record.result
    kind = result.value.get("kind") if isinstance(result, StoredOutcome) else None
    return "file_issue" if kind == "issue" else "comment"


def _target(answer: FiledIssue | Comment) -> int:
    return answer.number if isinstance(answer, FiledIssue) else answer.issue


def _rowid(cursor: sqlite3.Cursor) -> int:
    if cursor.lastrowid is None:  # pragma: no cover - an INSERT always sets it
        raise TrackerError("internal error: the database returned no row id")
    return cursor.lastrowid


def _issue(row: Sequence[Any]) -> Issue:
    return Issue(
        number=row[0],
        title=row[1],
        body=row[2],
        cause=row[3],
        reports=tuple(json.loads(row[4])),
        key=row[5],
        created=row[6],
    )


def _record_effect(
    connection: sqlite3.Connection,
    *,
    kind: Literal["issue", "comment"],
    target: int,
    id_: int,
    key: str | None,
    now: str,
) -> None:
    connection.execute(
        "INSERT INTO effects (kind, target, id, key, time) VALUES (?, ?, ?, ?, ?)",
        (kind, target, id_, key, now),
    )
