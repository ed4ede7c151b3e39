"""The person's commands: ``durably pending``, ``answer``, ``resume`` and ``console``.

Each works on a store given as

- a directory, the one a user passes to ``FileStore`` or ``JournalStore``
  (``durably pending runs/``);
- ``--state DIR``, the demo's layout (its runs live in ``DIR/runs``);
- ``--dsn DSN`` (or ``$DURABLY_DSN``), a Postgres store.

A directory wins over ``--state``, which wins over ``--dsn``; with none of them,
``.durably``'s runs. The wiring is here; the answer itself is
:func:`durably.decisions.answer`, the same function the console calls.
"""

from __future__ import annotations

import argparse
import errno
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._exit import EXIT, print_error
from ..storechoice import StoreChoice, opened_store
from ._args import choose_store, positive_int, store_options
from ._importpath import make_current_directory_importable

if TYPE_CHECKING:
    # Only for annotations: `durably --help` must not pay for asyncio, rich or the
    # loop (tests/test_startup.py); each command imports what it uses when it runs
    # (inspect, importlib and json too).
    from rich.console import Console

    from ..stores import Store

__all__ = ["add_person_commands", "choose_store", "load_factory"]

Handler = Callable[[argparse.Namespace, "Console", "Console"], int]


def load_factory(spec: str) -> Callable[..., Any]:
    """The callable ``MODULE:NAME`` names, imported.

    The current directory is importable only when it is the person's own and no one
    else can write it (:mod:`._importpath`); otherwise a failed import says so.

    Raises:
        ValueError: the spec is malformed, the module cannot be imported, or the name
            is missing or not callable.
    """
    import importlib

    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise ValueError(f"--agent {spec!r}: write MODULE:FACTORY, e.g. myapp.agents:refunds")
    why_not_here = make_current_directory_importable()
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f"; {why_not_here}" if why_not_here else ""
        raise ValueError(f"--agent {spec!r}: cannot import {module_name!r}: {exc}{hint}") from exc
    factory = module
    for part in name.split("."):
        factory = getattr(factory, part, None)  # type: ignore[assignment]
        if factory is None:
            raise ValueError(f"--agent {spec!r}: {module_name} has no {name!r}")
    if not callable(factory):
        raise ValueError(f"--agent {spec!r}: {name} is not callable")
    return factory


def build_agent(factory: Callable[..., Any], run_id: str) -> Any:
    """Call an agent factory: with the run ID when it takes an argument, else with none.

    It may build a ``durably.Agent`` or any front end's
    :class:`~durably.frontend.Drivable` (``durably.pydantic_ai.worker_agent(agent)``,
    ``durably.openai_agents.worker_agent(agent, runner)``).
    """
    import inspect

    from ..frontend import Drivable

    try:
        required = [
            p
            for p in inspect.signature(factory).parameters.values()
            if p.default is inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        required = []
    agent = factory(run_id) if required else factory()
    if not isinstance(agent, Drivable):
        kind = type(agent)
        hint = ""
        if kind.__module__.startswith("pydantic_ai"):
            hint = "; wrap a Pydantic AI agent with durably.pydantic_ai.worker_agent(agent)"
        elif kind.__module__.split(".")[0] == "agents":
            hint = (
                "; wrap an OpenAI Agents SDK agent with "
                "durably.openai_agents.worker_agent(agent, runner)"
            )
        raise ValueError(f"the factory returned {kind.__name__}, not a durably.Agent{hint}")
    return agent


# -- durably pending ---------------------------------------------------------------------


async def _pending(choice: StoreChoice) -> tuple[list[dict[str, Any]], list[str]]:
    from ..listing import list_runs

    rows: list[dict[str, Any]] = []
    async with opened_store(choice) as store:
        # The questions come with the runs' summaries: on a file store, from the
        # listing index, so only runs changed since the last listing are loaded.
        listed = await list_runs(store)
    unreadable = [f"{run_id}: {exc}" for run_id, exc in listed.unreadable]
    for summary in listed.summaries:
        for question in summary.questions:
            rows.append(
                {
                    "run": question.run_id,
                    "call": question.call_id,
                    "tool": question.tool,
                    "effect": question.effect,
                    "kind": "approval" if question.kind == "approve" else "in doubt",
                    "arguments": question.arguments,
                    "key": question.key,
                    "asked_at": question.asked_at.isoformat(),
                    "started_at": question.started_at.isoformat() if question.started_at else None,
                    "why": question.why,
                    "answers": list(question.answers),
                }
            )
    return rows, unreadable


def _cmd_pending(args: argparse.Namespace, console: Console, errors: Console) -> int:
    import asyncio

    from rich.table import Table
    from rich.text import Text

    try:
        choice = choose_store(args)
    except ValueError as exc:
        print_error(errors, exc)
        return EXIT["usage"]
    rows, unreadable = asyncio.run(_pending(choice))
    for problem in unreadable:
        print_error(errors, problem)
    if args.json:
        import json

        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return EXIT["failed"] if unreadable else EXIT["done"]
    if not rows:
        console.print(f"no open questions in {choice.describe()}", highlight=False)
        return EXIT["failed"] if unreadable else EXIT["done"]
    table = Table(title=f"open questions in {choice.describe()}", title_justify="left")
    for column in ("run", "call", "tool", "effect", "kind", "arguments", "key", "started", "why"):
        # IDs stay whole (people copy them into `durably answer`); the rest folds.
        table.add_column(column, overflow="fold", no_wrap=column in ("run", "call"))
    for row in rows:
        # Arguments and reasons come from the model: Text, never read as Rich markup.
        cells = (
            row["run"],
            row["call"],
            row["tool"],
            row["effect"] or "-",
            row["kind"],
            row["arguments"],
            row["key"],
            row["started_at"] or "-",
            row["why"] or "-",
        )
        table.add_row(*(Text(cell) for cell in cells))
    console.print(table)
    console.print(
        "answer with: durably answer RUN CALL yes|no (approval) or rerun|done (in doubt)",
        highlight=False,
        markup=False,
    )
    return EXIT["failed"] if unreadable else EXIT["done"]


# -- durably answer ----------------------------------------------------------------------


def _cmd_answer(args: argparse.Namespace, console: Console, errors: Console) -> int:
    import asyncio

    from ..decisions import answer, parse_answer

    try:
        choice = choose_store(args)
        given = parse_answer(args.answer, reason=args.reason, result=args.result)
    except ValueError as exc:
        print_error(errors, exc)
        return EXIT["usage"]

    async def save() -> None:
        async with opened_store(choice) as store:
            await answer(store, run_id=args.run, call_id=args.call, decision=given, by=_answerer())

    asyncio.run(save())  # Locked -> exit 4, AnswerRefused -> exit 1 (cli.main maps them)
    console.print(
        f"saved: {args.run} {args.call} {args.answer}; the run carries on when it is resumed "
        f"(durably resume {args.run} ... --agent MODULE:FACTORY, or a worker on Postgres)",
        highlight=False,
        markup=False,
    )
    return EXIT["done"]


def _answerer() -> str:
    """Who answers on the command line: the OS user, as ``getpass.getuser()`` names them."""
    import getpass

    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no LOGNAME/USER and no passwd entry (a bare container)
        user = "unknown user"
    return f"{user} (durably answer)"


# -- durably resume ----------------------------------------------------------------------


async def _drive_on(store: Store, agent: Any, run_id: str) -> Any:
    """Open ``run_id`` in ``store`` and let ``agent`` drive it (what ``Agent.resume`` does)."""
    from ..engine import shielded

    handle, state = await store.open(run_id)
    try:
        return await agent.drive(handle, state)
    finally:
        await shielded(handle.close())


def _cmd_resume(args: argparse.Namespace, console: Console, errors: Console) -> int:
    import asyncio

    from ..loop import Limits

    try:
        factory = load_factory(args.agent)
        has_store = bool(args.store or args.state is not None or args.dsn)
        choice = choose_store(args) if has_store else None
    except ValueError as exc:
        print_error(errors, exc)
        return EXIT["usage"]

    async def go() -> Any:
        agent = build_agent(factory, args.run)
        if args.max_resumes is not None:
            limits = agent.limits
            agent.limits = Limits(
                max_turns=limits.max_turns,
                max_tokens=limits.max_tokens,
                max_dollars=limits.max_dollars,
                max_resumes=args.max_resumes,
            )
        if choice is None:
            own = getattr(agent, "store", None)
            if own is None:
                raise ValueError(
                    f"the agent {args.agent} builds has no store (a worker's agent?): "
                    "name the store: a directory, --state DIR or --dsn"
                )
            return await _drive_on(own, agent, args.run)
        async with opened_store(choice) as store:
            # The agent's own store is not used: the loop drives the run opened here.
            return await _drive_on(store, agent, args.run)

    try:
        outcome = asyncio.run(go())
    except ValueError as exc:
        print_error(errors, exc)
        return EXIT["usage"]
    if outcome.status == "paused":
        console.print(
            f"paused: {len(outcome.pending)} question(s) wait for a person "
            "(durably pending lists them)",
            highlight=False,
        )
        return EXIT["paused"]
    if outcome.status == "cancelled":
        # As resuming a run cancelled before this open: finished, not done (exit 1).
        print_error(
            errors,
            f"run {outcome.run_id!r} was cancelled (`durably cancel`) after {outcome.turns} "
            f"turns, ${outcome.dollars:.4f}; it is finished and never resumed",
        )
        return EXIT["failed"]
    console.print(
        f"done: {outcome.run_id}, {outcome.turns} turns, ${outcome.dollars:.4f}", highlight=False
    )
    if outcome.answer:
        console.print(outcome.answer, highlight=False, markup=False)
    return EXIT["done"]


# -- durably console ---------------------------------------------------------------------


def _cmd_console(args: argparse.Namespace, console: Console, errors: Console) -> int:

    try:
        choice = choose_store(args)
    except ValueError as exc:
        print_error(errors, exc)
        return EXIT["usage"]
    try:
        from ..console.server import serve
    except ImportError as exc:
        errors.print(
            f"[red]error:[/red] the console needs Starlette and uvicorn ({exc}); "
            "install them with: pip install 'durably[console]'",
            highlight=False,
        )
        return EXIT["usage"]
    workspace = args.workspace
    if workspace is None and args.state is not None and not args.store:
        workspace = str(args.state / "worlds" / "{run}" / "workspace")  # the demo's layout
    try:
        serve(
            choice,
            host=args.host,
            port=args.port,
            read_only=args.read_only,
            workspace=workspace,
            say=lambda text: console.print(text, highlight=False, markup=False),
        )
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        print_error(
            errors,
            f"port {args.port} on {args.host} is in use (another console?): choose another "
            "with --port N, or --port 0 for any free one",
        )
        return EXIT["usage"]
    return EXIT["done"]


# -- registration ------------------------------------------------------------------------


_STORE_HELP = "the directory your FileStore/JournalStore writes to (default: .durably/runs)"


def add_person_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``pending``, ``answer``, ``resume`` and ``console`` on the ``durably`` parser."""
    pending = commands.add_parser("pending", help="list every question waiting for a person")
    pending.add_argument("store", nargs="?", metavar="STORE", help=_STORE_HELP)
    store_options(pending)
    pending.add_argument("--json", action="store_true", help="print the questions as JSON")
    pending.set_defaults(handler=_cmd_pending)

    answer_cmd = commands.add_parser(
        "answer", help="answer a waiting question (saved under the run's lock)"
    )
    answer_cmd.add_argument("run", help="run ID")
    answer_cmd.add_argument("call", help="call ID (durably pending lists them)")
    answer_cmd.add_argument(
        "answer",
        choices=("yes", "no", "rerun", "done"),  # decisions.WORDS, kept light
        help="yes/no for an approval, rerun/done for an in-doubt call",
    )
    answer_cmd.add_argument("store", nargs="?", metavar="STORE", help=_STORE_HELP)
    store_options(answer_cmd)
    answer_cmd.add_argument("--reason", help="with no: the reason the model sees")
    answer_cmd.add_argument("--result", help="with done: what the call returned")
    answer_cmd.set_defaults(handler=_cmd_answer)

    resume = commands.add_parser("resume", help="resume any agent's run from its last save")
    resume.add_argument("run", help="run ID")
    resume.add_argument(
        "store", nargs="?", metavar="STORE", help="use this directory instead of the agent's store"
    )
    store_options(resume)
    resume.add_argument(
        "--agent",
        required=True,
        metavar="MODULE:FACTORY",
        help="a function returning the durably.Agent (given the run ID if it takes an argument)",
    )
    resume.add_argument(
        "--max-resumes", type=positive_int, help="allow this many restarts over the run's life"
    )
    resume.set_defaults(handler=_cmd_resume)

    console_cmd = commands.add_parser(
        "console", help="a local web page: runs, timelines, questions to answer"
    )
    console_cmd.add_argument("store", nargs="?", metavar="STORE", help=_STORE_HELP)
    store_options(console_cmd)
    console_cmd.add_argument("--host", default="127.0.0.1", help="address (default: 127.0.0.1)")
    console_cmd.add_argument("--port", type=int, default=8470, help="port (default: 8470; 0: any)")
    console_cmd.add_argument(
        "--read-only", action="store_true", help="serve no write route (no answers)"
    )
    console_cmd.add_argument(
        "--workspace",
        metavar="PATTERN",
        help="a run's workspace directory, {run} standing for the run ID, to check the files "
        "it recorded (default with --state: DIR/worlds/{run}/workspace)",
    )
    console_cmd.set_defaults(handler=_cmd_console)
