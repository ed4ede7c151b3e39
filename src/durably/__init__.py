"""durably: LLM agent runs that survive any crash without repeating or skipping a side effect."""

from typing import TYPE_CHECKING

from .approval import DEFER as DEFER
from .approval import ApprovalRequest as ApprovalRequest
from .approval import Approver as Approver
from .approval import Done as Done
from .approval import No as No
from .approval import PolicyApprover as PolicyApprover
from .approval import Rerun as Rerun
from .approval import ResolveRequest as ResolveRequest
from .approval import ScriptedApprover as ScriptedApprover
from .approval import TerminalApprover as TerminalApprover
from .approval import Yes as Yes
from .errors import AgentChanged as AgentChanged
from .errors import AnswerRefused as AnswerRefused
from .errors import ApprovalUnavailable as ApprovalUnavailable
from .errors import CheckpointCorrupt as CheckpointCorrupt
from .errors import CheckpointTooNew as CheckpointTooNew
from .errors import DollarLimit as DollarLimit
from .errors import DurablyError as DurablyError
from .errors import InvalidRunId as InvalidRunId
from .errors import InvalidValue as InvalidValue
from .errors import LeaseLost as LeaseLost
from .errors import LimitExceeded as LimitExceeded
from .errors import Locked as Locked
from .errors import LockLost as LockLost
from .errors import MaxResumes as MaxResumes
from .errors import ModelError as ModelError
from .errors import OwnershipError as OwnershipError
from .errors import ReplayMismatch as ReplayMismatch
from .errors import RunError as RunError
from .errors import RunExists as RunExists
from .errors import RunNotFound as RunNotFound
from .errors import SaveFailed as SaveFailed
from .errors import StorageError as StorageError
from .errors import StoreUnavailable as StoreUnavailable
from .errors import TokenLimit as TokenLimit
from .errors import TurnLimit as TurnLimit
from .errors import UnsafePath as UnsafePath
from .errors import WorkspaceChanged as WorkspaceChanged
from .errors import WrongStore as WrongStore
from .keys import idempotency_key as idempotency_key
from .keys import new_run_id as new_run_id
from .loop import Agent as Agent
from .loop import ContextPolicy as ContextPolicy
from .loop import Event as Event
from .loop import EventKind as EventKind
from .loop import Limits as Limits
from .loop import Outcome as Outcome
from .models import Call as Call
from .models import CallLog as CallLog
from .models import Delta as Delta
from .models import Model as Model
from .models import ModelRequest as ModelRequest
from .models import Price as Price
from .models import Reply as Reply
from .models import ScriptedModel as ScriptedModel
from .models import UsageBound as UsageBound
from .state import Effect as Effect
from .state import Phase as Phase
from .state import RunState as RunState
from .state import Usage as Usage
from .stores.file import FileStore as FileStore
from .stores.journal import JournalStore as JournalStore
from .tools import NOT_FOUND as NOT_FOUND
from .tools import UNKNOWN as UNKNOWN
from .tools import Found as Found
from .tools import Lookup as Lookup
from .tools import Tool as Tool
from .tools import ToolContext as ToolContext
from .tools import ToolInDoubt as ToolInDoubt
from .tools import tool as tool
from .workspace import Workspace as Workspace


def _lazy(name: str) -> object:
    # Integrations load on first use, so `import durably` never imports psycopg; the
    # version too, as importlib.metadata is among the dearest imports of all.
    if name == "PostgresStore":
        from .postgres.store import PostgresStore

        return PostgresStore
    if name == "__version__":
        return _version()
    raise AttributeError(f"module 'durably' has no attribute {name!r}")


if not TYPE_CHECKING:
    # Hidden from type checkers: a module `__getattr__` would make every misspelt
    # `durably.X` type-check (as `object`). They see the names it gives below instead.
    __getattr__ = _lazy


_VERSION: str | None = None

if TYPE_CHECKING:
    # What __getattr__ gives, as type checkers should see it (never imported at run time).
    from .postgres.store import PostgresStore as PostgresStore

    __version__: str  # given by __getattr__, so importlib.metadata loads on first use


def _version() -> str:
    """The installed distribution's version, read once, on first use."""
    global _VERSION
    if _VERSION is None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            _VERSION = version("durably")
        except PackageNotFoundError:  # pragma: no cover - a source tree without install
            _VERSION = "0.0.0"
    return _VERSION


__all__ = [
    "DEFER",
    "NOT_FOUND",
    "UNKNOWN",
    "Agent",
    "AgentChanged",
    "AnswerRefused",
    "ApprovalRequest",
    "ApprovalUnavailable",
    "Approver",
    "Call",
    "CallLog",
    "CheckpointCorrupt",
    "CheckpointTooNew",
    "ContextPolicy",
    "Delta",
    "DollarLimit",
    "Done",
    "DurablyError",
    "Effect",
    "Event",
    "EventKind",
    "FileStore",
    "Found",
    "InvalidRunId",
    "InvalidValue",
    "JournalStore",
    "LeaseLost",
    "LimitExceeded",
    "Limits",
    "LockLost",
    "Locked",
    "Lookup",
    "MaxResumes",
    "Model",
    "ModelError",
    "ModelRequest",
    "No",
    "Outcome",
    "OwnershipError",
    "Phase",
    "PolicyApprover",
    "Price",
    "ReplayMismatch",
    "Reply",
    "Rerun",
    "ResolveRequest",
    "RunError",
    "RunExists",
    "RunNotFound",
    "RunState",
    "SaveFailed",
    "ScriptedApprover",
    "ScriptedModel",
    "StorageError",
    "StoreUnavailable",
    "TerminalApprover",
    "TokenLimit",
    "Tool",
    "ToolContext",
    "ToolInDoubt",
    "TurnLimit",
    "UnsafePath",
    "Usage",
    "UsageBound",
    "Workspace",
    "WorkspaceChanged",
    "WrongStore",
    "Yes",
    "idempotency_key",
    "new_run_id",
    "tool",
]
