"""Runs in PostgreSQL, for fleets: the store, its schema, the work queue and workers.

- :mod:`~durably.postgres.store`: :class:`PostgresStore`, runs owned through
  leases with fencing tokens, and :func:`current_lease`;
- :mod:`~durably.postgres.schema`: the tables and their migrations;
- :mod:`~durably.postgres.queue`: submitted runs, claimed by workers, parked for a person;
- :mod:`~durably.postgres.registry`: the agents workers run, by name;
- :mod:`~durably.postgres.worker`: :func:`submit` and :func:`work`, the loop
  ``durably worker`` runs; :mod:`~durably.postgres.commands`: the bodies of
  ``durably worker``, ``durably workers`` and ``durably submit``.

psycopg (the ``postgres`` extra) is imported when a store is made, never on import.
``docs/postgres.md`` describes it all.
"""

from .queue import RUNS_TO_CLAIM as RUNS_TO_CLAIM
from .queue import Claim as Claim
from .queue import claim as claim
from .queue import enqueue as enqueue
from .queue import park as park
from .registry import AgentFactory as AgentFactory
from .registry import AgentsHook as AgentsHook
from .registry import Registration as Registration
from .registry import Registry as Registry
from .registry import register as register
from .registry import registry as registry
from .schema import MIGRATIONS as MIGRATIONS
from .schema import QUEUED as QUEUED
from .schema import Migration as Migration
from .store import Lease as Lease
from .store import PostgresRun as PostgresRun
from .store import PostgresStore as PostgresStore
from .store import Stored as Stored
from .store import StoreStats as StoreStats
from .store import current_lease as current_lease
from .worker import WorkReport as WorkReport
from .worker import submit as submit
from .worker import work as work

__all__ = [
    "MIGRATIONS",
    "QUEUED",
    "RUNS_TO_CLAIM",
    "AgentFactory",
    "AgentsHook",
    "Claim",
    "Lease",
    "Migration",
    "PostgresRun",
    "PostgresStore",
    "Registration",
    "Registry",
    "StoreStats",
    "Stored",
    "WorkReport",
    "claim",
    "current_lease",
    "enqueue",
    "park",
    "register",
    "registry",
    "submit",
    "work",
]
