"""The Postgres store's former home, kept so ``durably.stores.postgres`` imports still work.

Everything lives in :mod:`durably.postgres` now (the store, its schema, the work
queue and the workers); this module re-exports the names it used to define.
"""

from ...postgres.queue import RUNS_TO_CLAIM as RUNS_TO_CLAIM
from ...postgres.queue import Claim as Claim
from ...postgres.schema import MIGRATIONS as MIGRATIONS
from ...postgres.schema import QUEUED as QUEUED
from ...postgres.schema import Migration as Migration
from ...postgres.store import Lease as Lease
from ...postgres.store import PostgresRun as PostgresRun
from ...postgres.store import PostgresStore as PostgresStore
from ...postgres.store import StoreStats as StoreStats
from ...postgres.store import current_lease as current_lease

__all__ = [
    "MIGRATIONS",
    "QUEUED",
    "RUNS_TO_CLAIM",
    "Claim",
    "Lease",
    "Migration",
    "PostgresRun",
    "PostgresStore",
    "StoreStats",
    "current_lease",
]
