"""durably: LLM agent runs that survive any crash without repeating or skipping a side effect.

Every public name is exported here, and loaded on first use: ``import durably``
imports none of the modules behind them, so the command line and a program
that uses one store pay only for what they touch. Type checkers read the
explicit re-exports under ``TYPE_CHECKING``; :data:`_EXPORTS` says where each
name lives at run time (a test keeps the two, and ``__all__``, in step).
"""

# typing.TYPE_CHECKING without importing typing (a few milliseconds of every
# start-up): mypy takes any name TYPE_CHECKING as true, so users' type checking
# sees the re-exports below (tests/typing/public_api.py is checked through them).
# No `from __future__ import annotations` either: nothing here needs it.
TYPE_CHECKING = False
if TYPE_CHECKING:
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
    from .decisions import AskLater as AskLater
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
    from .errors import RunCancelled as RunCancelled
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
    from .postgres.store import PostgresStore as PostgresStore
    from .state import Effect as Effect
    from .state import Phase as Phase
    from .state import RunState as RunState
    from .state import Usage as Usage
    from .stores.file import FileStore as FileStore
    from .stores.journal import JournalStore as JournalStore
    from .tools import NEVER_EXPIRES as NEVER_EXPIRES
    from .tools import NOT_FOUND as NOT_FOUND
    from .tools import UNKNOWN as UNKNOWN
    from .tools import Found as Found
    from .tools import KeyNotSent as KeyNotSent
    from .tools import Lookup as Lookup
    from .tools import Tool as Tool
    from .tools import ToolContext as ToolContext
    from .tools import ToolInDoubt as ToolInDoubt
    from .tools import tool as tool
    from .workspace import Workspace as Workspace

    __version__: str  # given by __getattr__, so importlib.metadata loads on first use

_EXPORTS: dict[str, str] = {
    "DEFER": "approval",
    "ApprovalRequest": "approval",
    "Approver": "approval",
    "Done": "approval",
    "No": "approval",
    "PolicyApprover": "approval",
    "Rerun": "approval",
    "ResolveRequest": "approval",
    "ScriptedApprover": "approval",
    "TerminalApprover": "approval",
    "Yes": "approval",
    "AskLater": "decisions",
    "AgentChanged": "errors",
    "AnswerRefused": "errors",
    "ApprovalUnavailable": "errors",
    "CheckpointCorrupt": "errors",
    "CheckpointTooNew": "errors",
    "DollarLimit": "errors",
    "DurablyError": "errors",
    "InvalidRunId": "errors",
    "InvalidValue": "errors",
    "LeaseLost": "errors",
    "LimitExceeded": "errors",
    "Locked": "errors",
    "LockLost": "errors",
    "MaxResumes": "errors",
    "ModelError": "errors",
    "OwnershipError": "errors",
    "ReplayMismatch": "errors",
    "RunCancelled": "errors",
    "RunError": "errors",
    "RunExists": "errors",
    "RunNotFound": "errors",
    "SaveFailed": "errors",
    "StorageError": "errors",
    "StoreUnavailable": "errors",
    "TokenLimit": "errors",
    "TurnLimit": "errors",
    "UnsafePath": "errors",
    "WorkspaceChanged": "errors",
    "WrongStore": "errors",
    "idempotency_key": "keys",
    "new_run_id": "keys",
    "Agent": "loop",
    "ContextPolicy": "loop",
    "Event": "loop",
    "EventKind": "loop",
    "Limits": "loop",
    "Outcome": "loop",
    "Call": "models",
    "CallLog": "models",
    "Delta": "models",
    "Model": "models",
    "ModelRequest": "models",
    "Price": "models",
    "Reply": "models",
    "ScriptedModel": "models",
    "UsageBound": "models",
    "Effect": "state",
    "Phase": "state",
    "RunState": "state",
    "Usage": "state",
    "FileStore": "stores.file",
    "JournalStore": "stores.journal",
    "NEVER_EXPIRES": "tools",
    "NOT_FOUND": "tools",
    "UNKNOWN": "tools",
    "Found": "tools",
    "KeyNotSent": "tools",
    "Lookup": "tools",
    "Tool": "tools",
    "ToolContext": "tools",
    "ToolInDoubt": "tools",
    "tool": "tools",
    "Workspace": "workspace",
    # An integration: importing it needs psycopg, so it is not in __all__ (a star
    # import must work without the extra), but durably.PostgresStore still works.
    "PostgresStore": "postgres.store",
}
"""Each lazily exported name, and the submodule it is loaded from."""

_SUBMODULES = frozenset(
    ("decisions", "faults", "models", "receivers", "stores", "sweep", "testing", "transports")
)
"""Public submodules that ``durably.X`` loads on first use, as the docs write them
(``durably.decisions.AskLater()`` after only ``import durably``)."""


def _lazy(name: str) -> object:
    # PEP 562: called only for names not yet in the module's namespace. The value
    # is stored there, so each name is looked up here once.
    where = _EXPORTS.get(name)
    if where is not None:
        from importlib import import_module

        value = getattr(import_module(f".{where}", __name__), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        from importlib import import_module

        return import_module(f".{name}", __name__)  # the import binds it here too
    if name == "__version__":
        return _version()
    raise AttributeError(f"module 'durably' has no attribute {name!r}")


if not TYPE_CHECKING:
    # Hidden from type checkers: a module `__getattr__` would make every misspelt
    # `durably.X` type-check (as `object`). They see the names it gives above instead.
    __getattr__ = _lazy
del TYPE_CHECKING  # only for the type checker: not a name of durably's


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, "__version__"})


_VERSION: str | None = None


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
    "NEVER_EXPIRES",
    "NOT_FOUND",
    "UNKNOWN",
    "Agent",
    "AgentChanged",
    "AnswerRefused",
    "ApprovalRequest",
    "ApprovalUnavailable",
    "Approver",
    "AskLater",
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
    "KeyNotSent",
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
    "RunCancelled",
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
