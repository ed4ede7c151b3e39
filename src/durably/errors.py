"""Every error durably raises, grouped by what the caller should do next.

The hierarchy::

    DurablyError
    ├── RunError                    the run cannot go on as asked; fix the cause, then resume
    │   ├── RunExists               a new run asked for an ID that was used before
    │   ├── RunNotFound             no run has this ID in this store
    │   ├── InvalidRunId            the ID is not of the allowed form
    │   ├── AgentChanged            the agent differs from the one the run was started with
    │   ├── WorkspaceChanged        files the run wrote were changed behind its back
    │   ├── MaxResumes              the run was restarted too many times
    │   ├── RunCancelled            the run was stopped by `durably cancel`; it never goes on
    │   ├── AnswerRefused           a person's answer does not fit an open question
    │   └── LimitExceeded           a turn, token or dollar limit was reached
    │       ├── TurnLimit
    │       ├── TokenLimit
    │       └── DollarLimit
    ├── OwnershipError              another process owns the run; wait or stop it
    │   ├── Locked                  the file store's lock is held elsewhere
    │   ├── LockLost                the held lock file was deleted or replaced; stop
    │   └── LeaseLost               the Postgres lease was taken over; this process must stop
    ├── StorageError                the checkpoint could not be read or written
    │   ├── CheckpointCorrupt       a file is not a valid checkpoint
    │   ├── CheckpointTooNew        a checkpoint of a newer format than this code knows
    │   ├── UnsafePath              a symlink or foreign file stands where the store writes
    │   ├── WrongStore              the run is kept by another kind of store
    │   ├── StoreUnavailable        the database could not be reached
    │   └── SaveFailed              a save did not become durable; the old state is the truth
    ├── ModelError                  the model provider failed or answered nonsense
    ├── ApprovalUnavailable         the approver could not be asked
    ├── InvalidValue                user code handed durably a value the state cannot hold
    ├── ReplayMismatch              the conversation departed from a recorded run
    └── (in durably.transports)     a remote tool failed; the model reads the message
        ├── HttpToolError
        └── McpToolError

Every class keeps its keyword fields as attributes, so callers can act on them
without parsing messages, and pickles with them (:class:`FieldsPickle`): the
sweep moves errors between processes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "AgentChanged",
    "AnswerRefused",
    "ApprovalUnavailable",
    "CheckpointCorrupt",
    "CheckpointTooNew",
    "DollarLimit",
    "DurablyError",
    "FieldsPickle",
    "InvalidRunId",
    "InvalidValue",
    "LeaseLost",
    "LimitExceeded",
    "LockLost",
    "Locked",
    "MaxResumes",
    "ModelError",
    "OwnershipError",
    "ReplayMismatch",
    "RunCancelled",
    "RunError",
    "RunExists",
    "RunNotFound",
    "SaveFailed",
    "StorageError",
    "StoreUnavailable",
    "TokenLimit",
    "TurnLimit",
    "UnsafePath",
    "WorkspaceChanged",
    "WrongStore",
]


class FieldsPickle:
    """Mixin: an exception built from keyword fields pickles by its fields.

    ``BaseException`` pickles as ``cls(*args)``, which a keyword-only
    ``__init__`` refuses; this rebuilds the exception without calling
    ``__init__`` (its message in ``args``, its fields from ``__dict__``), so it
    can cross a process boundary, as the sweep's workers send errors back.
    """

    __slots__ = ()
    args: tuple[Any, ...]  # given by BaseException, which this is mixed into

    def __reduce__(self) -> tuple[Any, ...]:
        """Rebuild as ``cls.__new__(cls, *args)`` with the fields restored as state."""
        return (_rebuild, (type(self), self.args), self.__dict__ or None)


def _rebuild(cls: type[BaseException], args: tuple[Any, ...]) -> BaseException:
    """An exception of ``cls`` with ``args``, made without running its ``__init__``."""
    return cls.__new__(cls, *args)


class DurablyError(FieldsPickle, Exception):
    """Root of every error durably raises on purpose."""

    __module__ = "durably"


class RunError(DurablyError):
    """The run cannot go on as asked; the message names the cause and the fix."""

    __module__ = "durably"


class RunExists(RunError):
    """Raised when a new run asks for an ID that this store has already used; pick a new ID."""

    __module__ = "durably"

    def __init__(self, *, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(
            f"run {run_id!r} already exists; run IDs are never reused, "
            "so resume it or start a run with a new ID"
        )


class RunNotFound(RunError):
    """Raised when no run has the given ID in this store; check the ID and the store's location."""

    __module__ = "durably"

    def __init__(self, *, run_id: str, where: str) -> None:
        self.run_id = run_id
        self.where = where
        super().__init__(
            f"no run {run_id!r} in {where}; check the run ID (`durably runs` lists them) "
            "and that the store points at the right place"
        )


class InvalidRunId(RunError):
    """Raised before any file is touched when a run ID is not of the allowed form."""

    __module__ = "durably"

    def __init__(self, *, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(
            f"invalid run ID {run_id!r}: use 1 to 128 characters from [A-Za-z0-9._-], "
            "starting with a letter or digit"
        )


class AgentChanged(RunError):
    """Raised on resume when the agent differs from the one the run started with.

    Pass ``allow_agent_change=True`` to resume anyway, after checking that saved
    attempt markers still mean what they meant.
    """

    __module__ = "durably"

    def __init__(self, *, run_id: str, differences: Sequence[str]) -> None:
        self.run_id = run_id
        self.differences = list(differences)
        listed = "; ".join(self.differences)
        super().__init__(
            f"run {run_id!r} was started with a different agent ({listed}); resume it with "
            "the original agent, or pass allow_agent_change=True once you have checked "
            "that its saved calls still mean the same"
        )


class WorkspaceChanged(RunError):
    """Raised on resume when a file the run wrote no longer has the hash the run recorded."""

    __module__ = "durably"

    def __init__(self, *, run_id: str, paths: Iterable[str]) -> None:
        self.run_id = run_id
        self.paths = sorted(paths)
        super().__init__(
            f"run {run_id!r}: files it wrote were changed outside the run: "
            f"{', '.join(self.paths)}; restore them (the run's state records their SHA-256) "
            "or start a new run"
        )


class MaxResumes(RunError):
    """Raised when a run has been opened for resume more times than its limit allows."""

    __module__ = "durably"

    def __init__(
        self, *, run_id: str, resumes: int, limit: int, last_stop: str | None = None
    ) -> None:
        self.run_id = run_id
        self.resumes = resumes
        self.limit = limit
        self.last_stop = last_stop
        where = f"; its last save before this open: {last_stop}" if last_stop else ""
        super().__init__(
            f"run {run_id!r} was restarted {resumes} time{'' if resumes == 1 else 's'}, past "
            f"max_resumes={limit}{where}. "
            "Opening a paused run is not a restart, so these opens found it unfinished: "
            "if it keeps dying at the same place, find why there; to go on, resume with a "
            "higher max_resumes (durably triage --max-resumes N)"
        )


class RunCancelled(RunError):
    """Raised when a run was stopped by ``durably cancel``: it is finished and never goes on.

    The run that is cancelled while it runs ends with it after its current save
    (``durably.Agent`` returns an outcome of status ``cancelled`` instead); resuming
    a cancelled run raises it at once. Start a new run with a new ID to do the work.
    """

    __module__ = "durably"

    def __init__(self, *, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(
            f"run {run_id!r} was cancelled (`durably cancel`) and is finished: it is never "
            "resumed; start a new run with a new ID to do its work"
        )


class AnswerRefused(RunError):
    """Raised when an answer has no open question to answer or does not fit it; nothing is saved."""

    __module__ = "durably"

    def __init__(self, *, run_id: str, call_id: str, reason: str) -> None:
        self.run_id = run_id
        self.call_id = call_id
        self.reason = reason
        super().__init__(
            f"run {run_id!r}, call {call_id!r}: answer refused: {reason}; "
            "`durably pending` lists the questions that stand"
        )


class LimitExceeded(RunError):
    """Raised when a run reaches one of its limits; resume with a higher limit to go on."""

    __module__ = "durably"
    kind = "limit"

    def __init__(self, *, run_id: str, used: float, limit: float) -> None:
        self.run_id = run_id
        self.used = used
        self.limit = limit
        super().__init__(
            f"run {run_id!r} reached its {self.kind} limit ({used:g} of {limit:g}); "
            f"its state is saved: resume it with a higher {self.kind} limit to go on"
        )


class TurnLimit(LimitExceeded):
    """Raised when a run has made as many model calls as ``max_turns`` allows."""

    __module__ = "durably"
    kind = "turn"


class TokenLimit(LimitExceeded):
    """Raised when a run has used as many tokens as ``max_tokens`` allows."""

    __module__ = "durably"
    kind = "token"


class DollarLimit(LimitExceeded):
    """Raised before a model call that could take a run's spend past ``max_dollars``."""

    __module__ = "durably"
    kind = "dollar"

    def __init__(
        self, *, run_id: str, used: float, limit: float, next_call: float | None = None
    ) -> None:
        if next_call is None:
            super().__init__(run_id=run_id, used=used, limit=limit)
        else:
            # LimitExceeded's message does not fit a call refused before it was made.
            RunError.__init__(
                self,
                f"run {run_id!r} stopped before a model call that could cost up to "
                f"${next_call:.4f}: ${used:.4f} of its max_dollars={limit:g} is spent, so the "
                "call could pass the budget and was not made; its state is saved: resume it "
                "with a higher dollar limit to go on",
            )
            self.run_id, self.used, self.limit = run_id, used, limit
        self.next_call = next_call


class OwnershipError(DurablyError):
    """Another process owns the run; wait for it to finish or stop it."""

    __module__ = "durably"


class Locked(OwnershipError):
    """Raised at once when another process holds the run's lock."""

    __module__ = "durably"

    def __init__(self, *, run_id: str, path: str, lease: bool = False) -> None:
        self.run_id = run_id
        self.path = path
        self.lease = lease
        """Whether a lease holds the run (it lapses if its holder dies), not a lock."""
        freed = (
            "its lease lapses if that process dies, and a worker then takes the run over"
            if lease
            else "the lock is freed the moment that process exits"
        )
        super().__init__(
            f"run {run_id!r} is open in another process ({'lease' if lease else 'lock'} "
            f"{path}); wait for it to finish or stop it; {freed}"
        )


class LockLost(OwnershipError):
    """Raised on save when the run's lock file was deleted or replaced while it was held; stop."""

    __module__ = "durably"

    def __init__(self, *, run_id: str, path: str) -> None:
        self.run_id = run_id
        self.path = path
        super().__init__(
            f"run {run_id!r}: its lock file {path} was deleted or replaced while this process "
            "held it (a tmp cleaner?), so another process may own the run now; nothing was "
            "written; stop here, and resume the run once no other process has it open "
            "(keep the state directory out of reach of tmp cleaners)"
        )


class LeaseLost(OwnershipError):
    """Raised on save when another worker took over the run's lease; this process must stop."""

    __module__ = "durably"

    def __init__(self, *, run_id: str, token: int, how: str | None = None) -> None:
        self.run_id = run_id
        self.token = token
        self.how = how
        """What became of the lease and what to do, when the store could tell (``lapsed
        ...`` or ``was taken over by OWNER ...``); None: taken over, as far as is known."""
        happened = how or (
            "was taken over by another worker; nothing was written; stop here, "
            "the new owner carries on"
        )
        super().__init__(f"run {run_id!r}: this process's lease (fencing token {token}) {happened}")


class StorageError(DurablyError):
    """The checkpoint could not be read or written."""

    __module__ = "durably"


class CheckpointCorrupt(StorageError):
    """Raised when a file is not a valid checkpoint; it is left untouched for inspection."""

    __module__ = "durably"

    def __init__(self, *, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(
            f"checkpoint {path} is corrupt: {reason}; it was left untouched: restore it "
            "from a backup or inspect it, durably will not start the run afresh"
        )


class CheckpointTooNew(StorageError):
    """Raised when a checkpoint was written by a newer durably than this one."""

    __module__ = "durably"

    def __init__(self, *, path: str, found: int, known: int) -> None:
        self.path = path
        self.found = found
        self.known = known
        super().__init__(
            f"checkpoint {path} has format {found}, newer than {known}, the newest this "
            "durably knows; upgrade durably to read it"
        )


class UnsafePath(StorageError):
    """Raised when a symlink or a foreign file stands at a path the store would use."""

    __module__ = "durably"

    def __init__(self, *, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(
            f"refusing to use {path}: {reason}; remove it if it is not yours "
            "(its target was not touched)"
        )


class WrongStore(StorageError):
    """Raised when a snapshot store opens a run the journal store keeps (it would miss the log)."""

    __module__ = "durably"

    def __init__(self, *, path: str, store: str) -> None:
        self.path = path
        self.store = store
        super().__init__(
            f"{path} belongs to a run kept by the {store} store; open it with that store "
            f"(`--store {store}` on the command line) so none of its saves is missed"
        )


class StoreUnavailable(StorageError):
    """Raised when the store's database cannot be reached for longer than a lease."""

    __module__ = "durably"

    def __init__(self, *, where: str, reason: str, outcome: str | None = None) -> None:
        self.where = where
        self.reason = reason
        outcome = outcome or "nothing was changed"
        super().__init__(
            f"{where}: the database could not be reached ({reason}); {outcome}: "
            "check the server and the DSN, then run the command again"
        )


class SaveFailed(StorageError):
    """Raised when a save did not become durable; the previous checkpoint is still the truth."""

    __module__ = "durably"

    def __init__(self, *, run_id: str, path: str, reason: str) -> None:
        self.run_id = run_id
        self.path = path
        self.reason = reason
        super().__init__(
            f"run {run_id!r}: saving {path} failed ({reason}); the previous checkpoint is "
            "still the truth; free disk space or fix permissions, then resume"
        )


class ModelError(DurablyError):
    """Raised when the model provider failed in a way retrying did not fix."""

    __module__ = "durably"

    def __init__(self, *, provider: str, reason: str, remedy: str) -> None:
        self.provider = provider
        self.reason = reason
        super().__init__(f"{provider}: {reason}; {remedy}")


class ApprovalUnavailable(DurablyError):
    """Raised when the approver cannot be asked (no terminal, a closed channel)."""

    __module__ = "durably"

    def __init__(self, *, run_id: str, call_id: str, reason: str) -> None:
        self.run_id = run_id
        self.call_id = call_id
        self.reason = reason
        super().__init__(
            f"run {run_id!r}: could not ask about call {call_id!r} ({reason}); the run is "
            "saved as paused: resume it where a person can answer, or with a policy approver"
        )


class InvalidValue(DurablyError):
    """Raised when user code hands durably a value the run state cannot hold.

    User code is an approver, a decision or a task; nothing of the value is saved, and the
    message names where it came from.
    """

    __module__ = "durably"

    def __init__(self, *, source: str, reason: str, remedy: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(f"{source}: {reason}; {remedy}")


class ReplayMismatch(DurablyError):
    """Raised when a recorded run is asked for a turn it did not record the same way."""

    __module__ = "durably"

    def __init__(self, *, path: str, turn: int, reason: str) -> None:
        self.path = path
        self.turn = turn
        self.reason = reason
        super().__init__(
            f"recording {path} cannot answer turn {turn}: {reason}; the conversation "
            "departed from the recording: record it again or use a real model"
        )
