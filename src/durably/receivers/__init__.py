"""The receiver's half: services that honour durably's idempotency keys.

- :class:`IdempotencyMiddleware` (``durably.receivers.asgi``): Stripe's
  ``Idempotency-Key`` semantics for any ASGI application;
- :func:`deduplicated` (``durably.receivers.mcp``): the same for the tools of
  an MCP server, with the key in the request's ``_meta``;
- :func:`lookup` and :class:`LookupApp`: "was this key processed, and with
  what result?", for an agent resolving a call left in doubt by a crash;
- :class:`IdempotencyStore`: the keys and results, in one SQLite file;
- :class:`KeyTable`: the same keys as a table in a service's own SQLite
  database, claimed, acted on and finished in the service's one transaction.

Nothing here imports a third-party package until it is used.
"""

from ._store import Busy as Busy
from ._store import Claimed as Claimed
from ._store import IdempotencyStore as IdempotencyStore
from ._store import KeyRecord as KeyRecord
from ._store import KeyState as KeyState
from ._store import KeyTable as KeyTable
from ._store import Mismatch as Mismatch
from ._store import Replay as Replay
from ._store import StoredOutcome as StoredOutcome
from .asgi import REPLAYED_HEADER as REPLAYED_HEADER
from .asgi import IdempotencyMiddleware as IdempotencyMiddleware
from .asgi import LookupApp as LookupApp
from .lookup import http_answer as http_answer
from .lookup import lookup as lookup
from .mcp import ReplayedError as ReplayedError
from .mcp import deduplicated as deduplicated
from .mcp import key_from_meta as key_from_meta

__all__ = [
    "REPLAYED_HEADER",
    "Busy",
    "Claimed",
    "IdempotencyMiddleware",
    "IdempotencyStore",
    "KeyRecord",
    "KeyState",
    "KeyTable",
    "LookupApp",
    "Mismatch",
    "Replay",
    "ReplayedError",
    "StoredOutcome",
    "deduplicated",
    "http_answer",
    "key_from_meta",
    "lookup",
]
