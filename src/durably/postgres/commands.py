"""The bodies of the Postgres commands: ``durably worker``, ``durably workers``, ``durably submit``.

:func:`serve` is the worker process: its log lines on stderr, the database waited
for (:func:`wait_for_database`), the agents registered, then :func:`~durably.postgres.worker.work`
until SIGTERM. The CLI (``durably.cli.worker``) only wires arguments to these.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from pathlib import Path

from .fleet import live_workers
from .registry import Registry, import_agents, load_entry_points, registry
from .store import PostgresStore
from .worker import WorkReport, submit, work

__all__ = ["serve", "submit_command", "wait_for_database", "workers_table"]

log = logging.getLogger("durably.worker")


async def serve(
    *,
    dsn: str,
    concurrency: int,
    state_dir: Path,
    lease: float,
    imports: Iterable[str] = (),
    say: Callable[[str], None] = print,
    database_wait: float = 300.0,
    prune_older_than: timedelta | None = None,
) -> WorkReport:
    """``durably worker``: serve the default registry and the installed hooks' agents until SIGTERM.

    ``imports`` are imported first (their agents register in :data:`registry`);
    then every ``durably.agents`` entry point registers its agents (the triage
    demo's among them), given ``state_dir``. SIGTERM and SIGINT set the stop
    event: runs in flight finish their current save and free their leases before
    this returns. A database that does not answer yet is waited for, with backoff, for
    up to ``database_wait`` seconds (:func:`wait_for_database`). With
    ``prune_older_than``, finished runs older than that are pruned at start and hourly.
    """
    import signal

    _log_to_stderr()
    import_agents(imports)
    serving = Registry()
    for name in registry.names():
        entry = registry.get(name)
        if entry is not None:
            serving.register(name, entry.factory, task=entry.task)
    load_entry_points(serving, state_dir=state_dir)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        async with PostgresStore(dsn, lease=timedelta(seconds=lease)) as store:
            await wait_for_database(store, within=database_wait, stop=stop)
            if stop.is_set():
                return WorkReport()
            await store.migrate()
            say(
                f"worker {store.owner}: {concurrency} at a time, agents: "
                f"{', '.join(serving.names())}; database {store.where}"
            )
            report = await work(
                store,
                registry=serving,
                concurrency=concurrency,
                stop=stop,
                prune_older_than=prune_older_than,
            )
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    say(
        f"stopped: {report.claimed} claimed, {report.done} done, {report.paused} paused, "
        f"{report.interrupted} handed back, {report.lease_lost} lost to another worker, "
        f"{report.parked} parked, {report.failed} failed, {report.cancelled} cancelled"
        + (f", {report.pruned} pruned" if prune_older_than is not None else "")
    )
    return report


class _WorkerLines(logging.Formatter):
    """The worker's log lines: time, level, and for the ladder's lines the run they concern."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        run_id = getattr(record, "run_id", None)
        if record.name == "durably.ladder" and run_id:
            head, _, rest = line.partition(f"{record.levelname} ")
            return f"{head}{record.levelname} {run_id}: {rest}"
        return line


def _log_to_stderr() -> None:
    """Show the worker's, the store's and the ladder's lines on stderr (once per process)."""
    root = logging.getLogger("durably")
    if any(getattr(h, "durably_worker", False) for h in root.handlers):
        return
    handler = logging.StreamHandler()
    handler.setFormatter(_WorkerLines("%(asctime)s %(levelname)s %(message)s"))
    handler.durably_worker = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    for name in ("durably.worker", "durably.ladder"):
        logging.getLogger(name).setLevel(logging.INFO)
    store_log = logging.getLogger("durably.store")
    if store_log.level == logging.NOTSET:
        store_log.setLevel(logging.WARNING)  # its retries are INFO: one line per try
    if root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    # stamina's own line per retry ("stamina.retry_scheduled") says less than ours.
    logging.getLogger("stamina").addHandler(logging.NullHandler())
    # psycopg_pool's "error connecting in 'durably'" names no database; ours do.
    logging.getLogger("psycopg.pool").addHandler(logging.NullHandler())


async def wait_for_database(
    store: PostgresStore, *, within: float, stop: asyncio.Event | None = None
) -> None:
    """Wait until the store's database accepts a connection, retrying with backoff.

    Each failure is logged with the database (``host:port/dbname``, never the
    password) and the real cause (``connection refused``, ``the database system is
    starting up``), and the wait before the next try. Retries use stamina's backoff
    (0.2 s doubling to 5 s, with jitter) for up to ``within`` seconds.

    Raises:
        StoreUnavailable: the database did not answer within ``within`` seconds.
    """
    import stamina
    from psycopg import AsyncConnection, OperationalError

    from ..errors import StoreUnavailable

    started = time.monotonic()
    tries = 0

    async def connect() -> None:
        nonlocal tries
        tries += 1
        timeout = max(1, min(10, round(within - (time.monotonic() - started))))
        conn = await AsyncConnection.connect(store.dsn, connect_timeout=timeout, autocommit=True)
        await conn.close()

    try:
        async for attempt in stamina.retry_context(
            on=_note_unreachable(store, started, within),
            attempts=None,
            timeout=within,
            wait_initial=0.2,
            wait_max=5.0,
            wait_jitter=0.2,
        ):
            with attempt:
                if stop is not None and stop.is_set():
                    return
                await connect()
    except OperationalError as exc:
        raise StoreUnavailable(
            where=store.where,
            reason=f"{_first_line(exc)}; waited {time.monotonic() - started:.0f}s over {tries} "
            "tries (durably worker --wait-for-database SECONDS waits longer)",
            outcome="no run was claimed",
        ) from exc
    if tries > 1:
        log.info("the database %s accepts connections (after %d tries)", store.where, tries)


def _note_unreachable(
    store: PostgresStore, started: float, within: float
) -> Callable[[Exception], bool]:
    """The ``on`` hook of stamina for :func:`wait_for_database`: logs each failure, retries it."""
    from psycopg import OperationalError

    def retry(exc: Exception) -> bool:
        if not isinstance(exc, OperationalError):
            return False
        left = within - (time.monotonic() - started)
        log.warning(
            "waiting for the database %s: %s (%.0fs left of --wait-for-database)",
            store.where,
            _first_line(exc),
            max(0.0, left),
        )
        return True

    return retry


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


async def workers_table(dsn: str) -> str:
    """``durably workers``: the live workers of the store at ``dsn``, as a text table."""
    from ..listing import table
    from ..state import age

    async with PostgresStore(dsn) as store:
        workers = await live_workers(store)
        where = store.where
    rows = [
        (
            w.owner,
            ", ".join(w.agents) or "-",
            f"{w.runs}/{w.concurrency}",
            age(w.started_at),
            age(w.seen_at),
        )
        for w in workers
    ]
    title = f"{len(rows)} live worker(s) in {where}"
    return table(("worker", "agents", "runs", "started", "last heartbeat"), rows, title=title)


async def submit_command(
    *, dsn: str, agent_name: str, task: str | None, run_id: str | None, imports: Iterable[str] = ()
) -> str:
    """``durably submit``: queue a run; the task defaults to the agent's registered task."""
    import_agents(imports)
    known = Registry()
    load_entry_points(known, state_dir=Path("."))  # only for their agents' default tasks
    entry = registry.get(agent_name) or known.get(agent_name)
    if entry is None:
        # A run queued for a name no worker serves would wait for ever, unclaimed.
        names = sorted({*registry.names(), *known.names()})
        raise ValueError(
            f"no agent named {agent_name!r} is registered, so no worker would claim the run; "
            f"registered: {', '.join(names) or 'none'}. Give --import MODULE for the module "
            "that calls durably.postgres.register (a worker needs the same --import)"
        )
    if task is None:
        if entry.task is None:
            raise ValueError(f"agent {agent_name!r} has no default task: give --task")
        task = entry.task
    async with PostgresStore(dsn) as store:
        return await submit(store, agent_name=agent_name, task=task, run_id=run_id)
