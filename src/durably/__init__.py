"""durably: LLM agent runs that survive any crash without repeating or skipping a side effect."""

from importlib.metadata import PackageNotFoundError, version

from .errors import AgentChanged as AgentChanged
from .errors import ApprovalUnavailable as ApprovalUnavailable
from .errors import CheckpointCorrupt as CheckpointCorrupt
from .errors import CheckpointTooNew as CheckpointTooNew
from .errors import DollarLimit as DollarLimit
from .errors import DurablyError as DurablyError
from .errors import InvalidRunId as InvalidRunId
from .errors import LeaseLost as LeaseLost
from .errors import LimitExceeded as LimitExceeded
from .errors import Locked as Locked
from .errors import MaxResumes as MaxResumes
from .errors import ModelError as ModelError
from .errors import ReplayMismatch as ReplayMismatch
from .errors import RunExists as RunExists
from .errors import RunNotFound as RunNotFound
from .errors import SaveFailed as SaveFailed
from .errors import TokenLimit as TokenLimit
from .errors import TurnLimit as TurnLimit
from .errors import UnsafePath as UnsafePath
from .errors import WorkspaceChanged as WorkspaceChanged
from .keys import idempotency_key as idempotency_key
from .keys import new_run_id as new_run_id
from .state import Effect as Effect
from .state import Phase as Phase
from .state import RunState as RunState
from .state import Usage as Usage
from .stores.file import FileStore as FileStore
from .workspace import Workspace as Workspace

try:
    __version__ = version("durably")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0"

__all__ = [
    "AgentChanged",
    "ApprovalUnavailable",
    "CheckpointCorrupt",
    "CheckpointTooNew",
    "DollarLimit",
    "DurablyError",
    "Effect",
    "FileStore",
    "InvalidRunId",
    "LeaseLost",
    "LimitExceeded",
    "Locked",
    "MaxResumes",
    "ModelError",
    "Phase",
    "ReplayMismatch",
    "RunExists",
    "RunNotFound",
    "RunState",
    "SaveFailed",
    "TokenLimit",
    "TurnLimit",
    "UnsafePath",
    "Usage",
    "Workspace",
    "WorkspaceChanged",
    "idempotency_key",
    "new_run_id",
]
