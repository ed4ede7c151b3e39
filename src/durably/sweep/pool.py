"""The pool: warmed-up worker processes that run a sweep's scenarios in parallel."""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import tempfile
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from . import _output
from .config import Config
from .job import SweepApprover, SweepJob
from .world import RUN_ID, StoreFactory, World, scratch_root

__all__ = ["Workers", "check_jobs", "scenario_workers"]


_pool_task: Callable[[Any], Any] | None = None
"""What a worker does with each item; set before the workers fork, so never pickled."""


def _call_pool_task(item: Any) -> Any:
    if _pool_task is None:  # pragma: no cover - set before the pool forks
        raise RuntimeError("sweep pool used before it was set up")
    return _pool_task(item)


def warm_up(job: SweepJob, config: Config, store: StoreFactory | None) -> None:
    """Run the job once, without crashing, in this worker: the processes it forks start warm.

    Whatever the job builds lazily (imports, compiled code, schemas, decoded
    recordings) is then in memory before the fork, so no scenario pays for it.
    ``gc.freeze`` keeps the collector from touching, and so copying, every
    inherited page in each child. A failed warm-up only leaves the worker cold:
    a pool initializer that raises makes the pool start workers forever.
    """
    try:
        with tempfile.TemporaryDirectory(prefix="durably-sweep-", dir=scratch_root()) as scratch:
            world = World(root=Path(scratch), config=config, store_factory=store)
            job.prepare(world)
            agent = job.agent(world, SweepApprover(job, world))
            asyncio.run(agent.run(job.task(), run_id=RUN_ID))
    except Exception:  # noqa: BLE001 - a warm-up that fails only costs speed; shown, not raised
        traceback.print_exc()
    gc.collect()
    gc.freeze()


def _start_worker(job: SweepJob, config: Config, store: StoreFactory | None) -> None:
    """A forked worker's initializer: its signals and stderr (:mod:`._output`), its warm-up."""
    _output.worker_started()
    warm_up(job, config, store)


def check_jobs(jobs: int) -> None:
    """Refuse a worker count no pool can have, before any work is done."""
    if jobs < 1:
        raise ValueError(f"jobs (worker processes) must be 1 or more, got {jobs}")


Workers = Literal["fork", "fresh"]
"""Where sweep workers come from: forked from the caller, or fresh interpreters."""


@contextmanager
def scenario_workers(  # noqa: PLR0917 - internal; the sweeps call it with the same five values
    jobs: int,
    job: SweepJob,
    config: Config,
    task: Callable[[Any], Any],
    store: StoreFactory | None = None,
    workers: Workers = "fork",
) -> Iterator[Callable[[Sequence[Any]], Iterator[Any]]]:
    """``jobs`` warmed-up worker processes doing ``task`` to items, results as they come.

    Workers are forked from this process, or with ``workers="fresh"`` started
    as fresh interpreters (:mod:`durably.sweep._fresh`). Each is warmed up once
    and forks one child per process of a scenario. The warm-up never runs in
    the caller (a user's test process), even for a single job.
    """
    warm_args = (job, config, store)
    if workers == "fresh":
        from . import _fresh

        fresh = _fresh.start(jobs, task, warm_args, prepare=warm_up)
        try:
            yield fresh.imap_unordered
        finally:
            fresh.close()
        return
    global _pool_task
    _pool_task = task
    context = multiprocessing.get_context("fork")
    with context.Pool(jobs, initializer=_start_worker, initargs=warm_args) as pool:
        yield lambda items: pool.imap_unordered(_call_pool_task, items)
