"""``durably worker``, ``durably submit`` and ``durably workers``: Postgres workers.

The commands live in :mod:`durably.postgres.commands`; only their wiring is here.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from .._exit import EXIT, print_error
from ._args import dsn_option, duration, positive_amount, positive_int
from ._importpath import make_current_directory_importable

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["add_worker_commands"]


def _imported(modules: list[str], errors: Console) -> bool:
    """Import ``--import`` modules, from the current directory only if it is the person's own."""
    from ..postgres.registry import import_agents

    why_not_here = make_current_directory_importable()
    try:
        import_agents(modules)
    except ValueError as exc:
        print_error(errors, f"{exc}; {why_not_here}" if why_not_here else exc)
        return False
    return True


def _cmd_worker(args: argparse.Namespace, console: Console, errors: Console) -> int:
    import asyncio

    from ..postgres.commands import serve

    if not _imported(args.imports, errors):
        return EXIT["usage"]
    try:
        asyncio.run(
            serve(
                dsn=args.dsn,
                concurrency=args.concurrency,
                state_dir=args.state,
                lease=args.lease,
                imports=args.imports,
                say=console.print,
                database_wait=args.wait_for_database,
                prune_older_than=args.prune_done_older_than,
            )
        )
    except ValueError as exc:
        print_error(errors, exc)
        return EXIT["usage"]
    return EXIT["done"]


def _cmd_workers(args: argparse.Namespace, console: Console, errors: Console) -> int:
    import asyncio

    from ..postgres.commands import workers_table

    console.file.write(asyncio.run(workers_table(args.dsn)))
    console.file.flush()
    return EXIT["done"]


def _cmd_submit(args: argparse.Namespace, console: Console, errors: Console) -> int:
    import asyncio

    from ..postgres.commands import submit_command

    if not _imported(args.imports, errors):
        return EXIT["usage"]
    try:
        run_id = asyncio.run(
            submit_command(
                dsn=args.dsn,
                agent_name=args.agent,
                task=args.task,
                run_id=args.run,
                imports=args.imports,
            )
        )
    except ValueError as exc:
        print_error(errors, exc)
        return EXIT["usage"]
    console.print(run_id, highlight=False)
    return EXIT["done"]


def add_worker_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``durably worker`` and ``durably submit`` (the Postgres work queue)."""

    def common(command: argparse.ArgumentParser) -> None:
        dsn_option(
            command,
            "PostgreSQL connection string, no password in it (default: $DURABLY_DSN)",
            from_environment=True,
            required="DURABLY_DSN" not in os.environ,
        )
        command.add_argument(
            "--import",
            dest="imports",
            action="append",
            default=[],
            metavar="MODULE",
            help="import MODULE first; it registers agents with durably.postgres.register",
        )

    worker = commands.add_parser(
        "worker", help="claim runs from a Postgres store and carry them on until SIGTERM"
    )
    common(worker)
    worker.add_argument(
        "--concurrency", type=positive_int, default=4, help="runs at once (default: 4)"
    )
    worker.add_argument(
        "--state",
        type=Path,
        default=Path(".durably"),
        help="directory for agents that keep files, given to their durably.agents hooks "
        "(the triage demo keeps its worlds there; default: .durably)",
    )
    worker.add_argument(
        "--lease", type=positive_amount, default=15.0, help="lease length in seconds (default: 15)"
    )
    worker.add_argument(
        "--wait-for-database",
        type=positive_amount,
        default=300.0,
        metavar="SECONDS",
        help="at start, wait this long for the database to accept connections, trying again "
        "with backoff (default: 300); then give up with exit status 1",
    )
    worker.add_argument(
        "--prune-done-older-than",
        type=duration,
        default=None,
        metavar="AGE",
        help="also delete finished runs (done, cancelled) last saved longer ago than AGE "
        "(30d, 12h, 90m, 45s), at start and then hourly; never a run a live lease holds",
    )
    worker.set_defaults(handler=_cmd_worker)

    workers = commands.add_parser(
        "workers", help="list the live workers of a Postgres store, with the agents they serve"
    )
    dsn_option(
        workers,
        "PostgreSQL connection string, no password in it (default: $DURABLY_DSN)",
        from_environment=True,
        required="DURABLY_DSN" not in os.environ,
    )
    workers.set_defaults(handler=_cmd_workers, plain_output=True)

    submit = commands.add_parser("submit", help="queue a run for a worker to start")
    common(submit)
    submit.add_argument("--agent", required=True, help="registered agent name, e.g. triage:TASK")
    submit.add_argument("--task", help="the task (default: the agent's own, for triage)")
    submit.add_argument("--run", help="use this run ID (default: a new one)")
    submit.set_defaults(handler=_cmd_submit)
