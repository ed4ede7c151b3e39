"""The receiver's half: services that honour durably's idempotency keys.

- :class:`IdempotencyMiddleware` (``durably.receivers.asgi``): Stripe's
  ``Idempotency-Key`` semantics for any ASGI application;
- :func:`deduplicated` (``durably.receivers.mcp``): the same for the tools of
  an MCP server, with the key in the request's ``_meta``;
- :func:`lookup` and :class:`LookupApp`: "was this key processed, and with
  what result?", for an agent resolving a call left in doubt by a crash;
- :class:`IdempotencyStore`: the keys and results, in one SQLite file;
- :class:`KeyTable`: the same keys as a table in a service's own SQLite
  database, claimed, acted on and finished in the service's one transaction;
- :class:`PostgresIdempotencyStore` (``durably.receivers.postgres``): the same
  in PostgreSQL, where an endpoint's effect can commit with its key
  (:func:`transaction`).

Nothing here imports a third-party package until it is used.
"""

from ._keys import Abandoned as Abandoned
from ._keys import Busy as Busy
from ._keys import Claimed as Claimed
from ._keys import KeyRecord as KeyRecord
from ._keys import KeyState as KeyState
from ._keys import KeyStore as KeyStore
from ._keys import Mismatch as Mismatch
from ._keys import Replay as Replay
from ._keys import StoredOutcome as StoredOutcome
from ._keys import renewing as renewing
from ._store import IdempotencyStore as IdempotencyStore
from ._store import KeyTable as KeyTable
from .asgi import REPLAYED_HEADER as REPLAYED_HEADER
from .asgi import IdempotencyMiddleware as IdempotencyMiddleware
from .asgi import LookupApp as LookupApp
from .lookup import http_answer as http_answer
from .lookup import lookup as lookup
from .mcp import ReplayedError as ReplayedError
from .mcp import deduplicated as deduplicated
from .mcp import key_from_meta as key_from_meta
from .postgres import PostgresIdempotencyStore as PostgresIdempotencyStore
from .postgres import transaction as transaction

__all__ = [
    "REPLAYED_HEADER",
    "Abandoned",
    "Busy",
    "Claimed",
    "IdempotencyMiddleware",
    "IdempotencyStore",
    "KeyRecord",
    "KeyState",
    "KeyStore",
    "KeyTable",
    "LookupApp",
    "Mismatch",
    "PostgresIdempotencyStore",
    "Replay",
    "ReplayedError",
    "StoredOutcome",
    "deduplicated",
    "http_answer",
    "key_from_meta",
    "lookup",
    "renewing",
    "transaction",
]
