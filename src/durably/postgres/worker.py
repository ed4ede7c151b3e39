"""Workers: processes that claim runs from a Postgres store and carry them on.

A run is started by a worker when it was *submitted* (:func:`submit` records a
queued run: an ID, an agent name and a task, no state yet), and resumed by any
worker when the process that ran it died (its lease expired). Agents are found
by name in a :class:`~durably.postgres.registry.Registry`: ``register(name, factory)`` with
``factory(run_id) -> Agent``, a ``durably.Agent`` or any front end's
:class:`~durably.frontend.Drivable` (a Pydantic AI agent through
``durably.pydantic_ai.worker_agent(agent)``). The agent needs no store: the worker
hands it the handle of the run it claimed.

:func:`work` loops until told to stop: it claims up to ``concurrency`` runs
whose lease is absent or expired (:func:`durably.postgres.queue.claim`, one
``UPDATE`` over ``SELECT ... FOR UPDATE SKIP LOCKED``), starts queued ones with
``Agent.start`` and carries the others on with ``Agent.drive``, both on the
claimed handle. Any number of workers on any
number of machines can share a database.

What happens to a run, by how it ended:

- done, or paused for a person: nothing more; workers never claim them;
- ``LeaseLost``: another worker took it over; this one stops touching it;
- a problem a retry cannot fix (a limit, ``MaxResumes``, a changed agent or
  workspace, a corrupt checkpoint, an unknown agent): the run is *parked*
  (``durably_runs.parked`` says why) and no worker claims it until a person
  resumes it by hand;
- anything else (a database outage, a crashing model): the lease is freed and
  the run is claimed again later; ``max_resumes`` bounds the attempts.

Stopping (``stop`` set; ``durably worker`` sets it on SIGTERM and SIGINT) cancels
the runs in flight. The loop shields its saves, so each finishes the save it is
making, and every handle frees its lease on the way out: another worker can take
the runs over at once.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import timedelta

from ..engine import Outcome, shielded
from ..errors import (
    CheckpointCorrupt,
    CheckpointTooNew,
    DurablyError,
    LeaseLost,
    ReplayMismatch,
    RunCancelled,
    RunError,
    UnsafePath,
)
from ..frontend import Drivable
from ..keys import new_run_id
from .fleet import heartbeat, retire
from .queue import Claim, claim, enqueue, park
from .registry import Registry
from .store import PostgresRun, PostgresStore

__all__ = ["WorkReport", "submit", "work"]

log = logging.getLogger("durably.worker")

_PERMANENT = (RunError, CheckpointCorrupt, CheckpointTooNew, UnsafePath, ReplayMismatch)
"""Errors a retry cannot fix: the run is parked for a person."""


async def submit(
    store: PostgresStore, *, agent_name: str, task: str, run_id: str | None = None
) -> str:
    """Record a run for a worker to start, and return its run ID.

    The run is *queued*: a row with the agent's name and the task and no state.
    The worker that claims it starts it exactly as ``Agent.run`` would (save point
    1 included), so the run's fingerprint is that of the agent that really runs it.

    Args:
        store: the Postgres store workers claim from.
        agent_name: a name registered with the workers (see :func:`register`).
        task: the task, the run's first user message.
        run_id: use this ID (``RunExists`` if it was ever used); default: a new one.
    """
    run_id = run_id or new_run_id(agent_name)
    await enqueue(store, run_id=run_id, agent=agent_name, task=task)
    log.info("submitted %s (%s)", run_id, agent_name)
    return run_id


@dataclass
class WorkReport:
    """What one call to :func:`work` did."""

    claimed: int = 0
    started: int = 0
    """Queued runs started (the rest of ``claimed`` were resumed)."""
    done: int = 0
    paused: int = 0
    lease_lost: int = 0
    parked: int = 0
    failed: int = 0
    """Runs that stopped on a transient error; they are claimed again later."""
    interrupted: int = 0
    """Runs cancelled by the stop, their leases freed for the next worker."""
    cancelled: int = 0
    """Runs ``durably cancel`` stopped: each ended as ``cancelled`` after a save."""
    pruned: int = 0
    """Finished runs this worker's pruning deleted (``prune_older_than``)."""


async def work(  # noqa: C901 - the worker's loop: claim, run, park, renew, prune, stop, in order
    store: PostgresStore,
    *,
    registry: Registry,
    concurrency: int = 4,
    stop: asyncio.Event,
    poll: float = 0.5,
    prune_older_than: timedelta | None = None,
    prune_every: timedelta = timedelta(hours=1),
) -> WorkReport:
    """Claim and carry on runs until ``stop`` is set; return what was done.

    Args:
        store: where the runs live.
        registry: the agents this worker can run; only their runs are claimed.
        concurrency: runs driven at once.
        stop: set it to stop; runs in flight are cancelled after their current save
            and their leases freed.
        poll: seconds between looks for work when there is none (or no free slot).
        prune_older_than: if set, prune finished runs last saved longer ago than this
            (``store.prune``) at start and then every ``prune_every``.
        prune_every: how often to prune.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    if prune_every <= timedelta(0):
        raise ValueError(f"prune_every must be positive, got {prune_every}")
    report = WorkReport()
    running: set[asyncio.Task[None]] = set()
    stopping = asyncio.ensure_future(stop.wait())
    beating = asyncio.create_task(
        _beat(store, registry.names(), concurrency), name="durably-worker-heartbeat"
    )
    pruning = (
        asyncio.create_task(
            _prune_forever(store, prune_older_than, prune_every, report),
            name="durably-worker-prune",
        )
        if prune_older_than is not None
        else None
    )
    try:
        while not stop.is_set():
            free = concurrency - len(running)
            claims: list[Claim] = []
            if free > 0:
                try:
                    claims = await claim(store, agents=registry.names(), limit=free)
                except DurablyError as exc:
                    log.warning("could not claim runs: %s", exc)
                except Exception as exc:  # the database is down or restarting: try again
                    if not _is_database_error(exc):
                        raise
                    log.warning("could not claim runs from %s: %s", store.where, exc)
            for claimed in claims:
                report.claimed += 1
                task = asyncio.create_task(
                    _drive(registry, claimed, report), name=f"durably-run-{claimed.run_id}"
                )
                running.add(task)
                task.add_done_callback(running.discard)
            if claims and len(claims) == free:
                continue  # there may be more work: look again at once
            await asyncio.wait([stopping, *running], timeout=poll, return_when="FIRST_COMPLETED")
    finally:
        stopping.cancel()
        beating.cancel()
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(list(running))
        await asyncio.wait([beating])
        if pruning is not None:  # a batch is one statement: cancelled, it lands or not
            pruning.cancel()
            await asyncio.wait([pruning])
        await shielded(_retire(store))
    return report


async def _beat(store: PostgresStore, agents: list[str], concurrency: int) -> None:
    """Keep this worker's row of ``durably_workers`` live: a heartbeat every renewal period."""
    every = store.renew_every.total_seconds()
    failing = False
    while True:
        try:
            await heartbeat(store, agents=agents, concurrency=concurrency, ttl=store.lease)
        except DurablyError as exc:
            if not failing:  # once per outage, not once a beat
                log.warning("could not record the worker's heartbeat: %s", exc)
            failing = True
        except Exception as exc:
            if not _is_database_error(exc):
                raise
            if not failing:
                log.warning("could not record the worker's heartbeat in %s: %s", store.where, exc)
            failing = True
        else:
            if failing:
                log.info("the database %s answers again", store.where)
            failing = False
        await asyncio.sleep(every)


async def _retire(store: PostgresStore) -> None:
    try:
        await retire(store)
    except Exception as exc:  # its row expires by itself
        if not isinstance(exc, DurablyError) and not _is_database_error(exc):
            raise
        log.info("could not remove the worker's row (%s); it expires by itself", exc)


def _is_database_error(exc: BaseException) -> bool:
    import psycopg

    return isinstance(exc, psycopg.Error)


async def _drive(registry: Registry, claimed: Claim, report: WorkReport) -> None:
    """Carry one claimed run on; never raises (except the worker's own cancellation)."""
    handle = claimed.handle
    handle.activate()
    run_id = claimed.run_id
    release = True
    try:
        try:
            state = claimed.load()
            registration = registry.get(claimed.agent)
            if registration is None:
                raise LookupError(f"no agent named {claimed.agent!r} is registered")
            try:
                agent = registration.factory(run_id)
            except Exception as exc:
                raise _FactoryFailed(f"{type(exc).__name__}: {exc}") from exc
            if not isinstance(agent, Drivable):
                raise _FactoryFailed(_not_drivable(claimed.agent, agent))
            if state is None:
                report.started += 1
                log.info("starting %s (%s)", run_id, claimed.agent)
                outcome = await agent.start(handle, claimed.task)
            else:
                _log_whence(claimed)
                log.info("resuming %s (%s, phase %s)", run_id, claimed.agent, state.phase)
                outcome = await agent.drive(handle, state)
        except asyncio.CancelledError:
            report.interrupted += 1
            log.info("stopped %s; its lease is freed for another worker", run_id)
            raise
        except RunCancelled:  # a front end that raises it rather than returning the outcome
            report.cancelled += 1
            log.info("cancelled %s (durably cancel)", run_id)
        except LeaseLost as exc:
            report.lease_lost += 1
            log.warning("%s (%s)", exc, handle.store.where)
        except (*_PERMANENT, LookupError, _FactoryFailed) as exc:
            report.parked += 1
            log.error("parking %s: %s", run_id, exc)
            # Park while the lease is still held; the lease is freed afterwards (finally).
            # Freed first, another claim could take the run in between and fail it again.
            await _park(handle, f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - a run's own failure is counted and retried, never the worker's end
            report.failed += 1
            # Keep the lease until it runs out: the run is retried one lease from now,
            # not in a tight loop against a failing database or model.
            release = False
            log.warning(
                "run %s stopped (%s: %s); it will be claimed again", run_id, type(exc).__name__, exc
            )
        else:
            _count(outcome, report)
    finally:
        await shielded(handle.close(release=release))


def _not_drivable(name: str, agent: object) -> str:
    """Why a factory's product cannot be run, and what to register instead."""
    kind = type(agent)
    hint = (
        "; wrap a Pydantic AI agent with durably.pydantic_ai.worker_agent(agent)"
        if kind.__module__.startswith("pydantic_ai")
        else ""
    )
    return (
        f"the factory of agent {name!r} returned a {kind.__module__}.{kind.__qualname__}, "
        f"which has no start(handle, task) and drive(handle, state){hint}"
    )


def _log_whence(claimed: Claim) -> None:
    """Log how this worker came to hold a started run.

    ``took over RUN from OWNER (lease expired T ago)``, or that its owner handed it back.
    """
    owner = claimed.previous_owner
    if owner is None:
        return
    if claimed.expired_ago is None:
        log.info("%s was handed back by %s", claimed.run_id, owner)
    else:
        log.info(
            "took over %s from %s (lease expired %.1fs ago)",
            claimed.run_id,
            owner,
            claimed.expired_ago,
        )


class _FactoryFailed(Exception):
    """The registered factory could not build the run's agent."""


def _count(outcome: Outcome, report: WorkReport) -> None:
    if outcome.status == "done":
        report.done += 1
        log.info("done %s after %d turns", outcome.run_id, outcome.turns)
    elif outcome.status == "cancelled":
        report.cancelled += 1
        log.info("cancelled %s after %d turns (durably cancel)", outcome.run_id, outcome.turns)
    else:
        report.paused += 1
        log.info(
            "paused %s: %d question(s) wait for a person", outcome.run_id, len(outcome.pending)
        )


async def _prune_forever(
    store: PostgresStore, older_than: timedelta, every: timedelta, report: WorkReport
) -> None:
    """Prune finished runs older than ``older_than`` now and every ``every``; never raises."""
    while True:
        try:
            pruned = await store.prune(older_than=older_than)
        except Exception as exc:  # an outage or a refused privilege: say so, try next period
            if not isinstance(exc, DurablyError) and not _is_database_error(exc):
                raise
            log.warning("could not prune finished runs in %s: %s", store.where, exc)
        else:
            report.pruned += len(pruned.pruned)
            if pruned.pruned or pruned.owned:
                log.info(
                    "pruned %d finished run(s) older than %s; %d still held by their owner",
                    len(pruned.pruned),
                    older_than,
                    len(pruned.owned),
                )
        await asyncio.sleep(every.total_seconds())


async def _park(handle: PostgresRun, reason: str) -> None:
    try:
        await shielded(park(handle, reason))
    except DurablyError as exc:
        log.warning("could not park %s: %s", handle.run_id, exc)
