"""``durably triage``: run the reference triage agent, or carry on its unfinished run.

The state directory holds the checkpoints (``runs/``) and one world per run
(``worlds/<run>/``: the workspace, the tracker's database, the model's call
log). Running the same command again finds the task's unfinished run and
resumes it, saying where it stood.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .. import faults
from .._exit import EXIT, print_error, runs_dir
from .._sysio import write_file
from ..approval import Approver, PolicyApprover, TerminalApprover
from ..decisions import AskLater
from ..errors import DurablyError, ModelError
from ..keys import new_run_id
from ..loop import Event, Limits, Outcome
from ..models.select import choose_model, resolve_spec
from ..state import LADDER_STEPS, Phase
from ..stores._guard import check_trusted
from ..stores.file import FileStore
from ..stores.journal import JournalStore
from .agent import build_agent, recording_path
from .checks import run_checks
from .world import TASKS, World, WorldError, load_task

__all__ = ["triage", "worlds_dir"]

_EFFECT_STYLE = {"read": "dim", "idempotent": "cyan", "keyed": "green", "write": "yellow"}


def worlds_dir(state_dir: Path) -> Path:
    """Where the CLI keeps the worlds of a state directory."""
    return state_dir / "worlds"


class _Live:
    """Prints the loop's events as they happen."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.effects: dict[str, str] = {}
        self.streaming = False

    def __call__(self, event: Event) -> None:
        data, say = event.data, self.console.print
        if event.kind == "text-delta":  # a streaming model's text, as it is written
            say(data["text"], end="", style="dim", markup=False, highlight=False)
            self.streaming = True
            return
        if self.streaming and event.kind != "arguments-delta":
            say()
            self.streaming = False
        if event.kind == "reply":
            calls = data["calls"]
            text = (data.get("text") or "").strip().splitlines()
            first = text[0][:90] if text else ""
            say(f"[bold]turn {data['turn']}[/bold] [dim]${data['dollars']:.4f}[/dim] {first}")
            if not calls:
                say("[bold green]answer[/bold green]")
                for line in text:
                    say(f"  {line}")
        elif event.kind == "call":
            style = _EFFECT_STYLE.get(data["effect"], "")
            effect = f"[{style}]{data['effect']}[/{style}]"
            say(f"  -> {data['tool']} {effect} [dim]{data['call_id']}[/dim]")
        elif event.kind == "result" and data.get("is_error"):
            say(f"     [red]error[/red] {str(data['content'])[:120]}")
        elif event.kind == "ladder":
            step = LADDER_STEPS[data["step"]]
            say(
                f"  [magenta]in doubt[/magenta] {data['tool']} {data['call_id']}: "
                f"ladder step {data['step']} ({step}) -> {data['outcome']}"
            )
        elif event.kind == "unavailable":
            say(f"  [yellow]nobody to ask[/yellow] about {data['tool']}: {data['reason']}")
        elif event.kind in ("approved", "refused"):
            say(f"  approval for {data['tool']}: {event.kind}")
        elif event.kind == "resumed":
            say(
                f"[bold]resuming[/bold] {event.run_id}: phase {data['phase']}, "
                f"turn {data['turns']}, restart {data['resumes']}"
            )


def _check_trusted_directories(*directories: Path) -> None:
    """Refuse an existing directory that another user owns or can write (as ssh does).

    A world holds the code the run patches and the tests it runs: whoever can
    swap files there can make this user run their code.
    """
    for path in directories:
        if path.exists():
            check_trusted(path.stat(), path=str(path), directory=True)


def _find_unfinished(store: FileStore, task: str) -> tuple[str | None, str | None]:
    """The newest run of ``task`` that is not done, or None and the newest run (all done).

    Run IDs sort by their UTC time. The second item lets the command say which
    finished run it is not resuming when it starts a new one.
    """
    candidates = [r for r in store.list_runs_sync() if r.startswith(f"{task}-")]
    for run_id in reversed(candidates):
        try:
            state = store.read_sync(run_id)
        except DurablyError:
            # An unreadable run is never replaced by a fresh one: resume it and fail loudly.
            return run_id, None
        if state.phase is not Phase.DONE:
            return run_id, None
    return None, (candidates[-1] if candidates else None)


async def triage(args: argparse.Namespace, console: Console, errors: Console | None = None) -> int:  # noqa: C901, PLR0912 - the demo command's flags, each checked where it is read
    """Run or resume the triage agent as the command line asked; return the exit code.

    Progress goes to ``console``; usage errors go to ``errors`` (default: stderr).
    """
    errors = errors or Console(stderr=True)
    if args.task not in TASKS:
        errors.print(f"[red]error:[/red] unknown task {args.task!r}; tasks: {', '.join(TASKS)}")
        return EXIT["usage"]
    state_dir: Path = args.state
    store = (
        JournalStore(state_dir / "runs")
        if args.store == "journal"
        else FileStore(runs_dir(state_dir))
    )
    _check_trusted_directories(state_dir)
    run_id, finished = args.run, None
    if run_id is None and not args.new:
        run_id, finished = _find_unfinished(store, args.task)
    resuming = run_id is not None
    if run_id is None:
        run_id = new_run_id(args.task)
    _check_trusted_directories(worlds_dir(state_dir), worlds_dir(state_dir) / run_id)
    try:
        if resuming:
            world = World.open(worlds_dir(state_dir) / run_id)
        else:
            world = World.create(worlds_dir(state_dir) / run_id, args.task)
        spec = _model_spec(args.model, world, resuming=resuming)
        # A provider model also records the run into the world, so it can become a test.
        model = choose_model(
            spec,
            recording=recording_path(world.task),
            log=world.model_log,
            record_to=world.root / "recording.json",
        )
    except WorldError as exc:
        print_error(errors, exc)
        if not resuming:
            # Whatever of a world was made a moment ago belongs to no run.
            shutil.rmtree(worlds_dir(state_dir) / run_id, ignore_errors=True)
            errors.print("no run was started", highlight=False)
        return EXIT["failed"]
    except ModelError as exc:
        print_error(errors, exc)
        if not resuming:
            shutil.rmtree(world.root)  # made a moment ago for a run that never started
        return EXIT["usage"]

    approver: Approver = (
        TerminalApprover()
        if args.approve == "on"
        else AskLater()
        if args.approve == "later"
        else PolicyApprover()
    )
    agent = build_agent(
        world=world,
        store=store,
        approver=approver,
        model=model,
        limits=Limits(
            max_turns=args.max_turns,
            max_dollars=args.max_dollars,
            max_resumes=args.max_resumes,
        ),
        observer=_Live(console),
    )
    # The live display prints each verdict and approval itself: the ladder's own log
    # line would repeat it on stderr (a handler here keeps its last resort quiet).
    logging.getLogger("durably.ladder").addHandler(logging.NullHandler())
    plan = faults.CrashPlan()
    if args.die_after:
        if args.die_after not in agent.tools:
            known = ", ".join(sorted(agent.tools))
            errors.print(f"[red]error:[/red] no tool {args.die_after!r}; tools: {known}")
            if not resuming:
                shutil.rmtree(world.root)  # made a moment ago for a run that never started
            return EXIT["usage"]
        plan = faults.CrashPlan(label=f"loop.tool_returned:{args.die_after}")

    with faults.installed(plan):
        if resuming:
            outcome = await agent.resume(run_id)
        else:
            task = load_task(args.task)
            about = f"{run_id} ({args.task}, model {agent.model.name})"
            if finished is None:
                console.print(f"[bold]new run[/bold] {about}")
            else:  # the same command resumed the task's last run; that run is over
                console.print(f"run {finished} is done; starting a new run {about}")
            outcome = await agent.run(task.description, run_id=run_id)
    return _report(outcome, world, runs_dir(state_dir), console)


def _model_spec(asked: str | None, world: World, *, resuming: bool) -> str:
    """The model to use: as asked; else, on resume, the one the run started with.

    A new run's choice is written into its world, so a resume without ``--model``
    never switches models under it (which would stop with ``AgentChanged``).
    """
    chosen = world.root / "model.txt"
    if asked is None and resuming and chosen.exists():
        return chosen.read_text().strip()
    provider, name = resolve_spec(asked)
    spec = "replay" if provider == "replay" else f"{provider}:{name}"
    if not resuming:
        try:
            write_file(chosen, (spec + "\n").encode(), mode=0o600)
        except OSError as exc:
            raise WorldError(
                f"{chosen} could not be written ({exc.strerror}); "
                "free disk space or fix permissions, then try again"
            ) from exc
    return spec


def _report(outcome: Outcome, world: World, store_dir: Path, console: Console) -> int:
    state = outcome.state
    if outcome.status == "paused":
        console.print(
            f"[yellow]paused[/yellow]: {len(outcome.pending)} question(s) wait for a person"
        )
        for pending in outcome.pending:
            console.print(f"  {pending.kind} {pending.tool} {pending.call_id}: {pending.why or ''}")
        console.print(
            "answer them with `durably answer` or `durably console` (or on the terminal with "
            "--approve on), then run the same command again"
        )
        return EXIT["paused"]
    checks = run_checks(world=world, state=state, store_dir=store_dir)
    passed = sum(c.ok for c in checks)
    table = Table(title=f"run {state.run_id}", title_justify="left", show_header=False)
    table.add_row("turns", str(state.turns))
    table.add_row("restarts", str(state.resumes))
    table.add_row(
        "spent",
        f"${state.dollars:.4f} ({state.usage.input_tokens} in / {state.usage.output_tokens} out)",
    )
    if state.unsaved_replies:
        table.add_row(
            "lost replies",
            f"{state.unsaved_replies}, counted at their worst case: ${state.unsaved_dollars:.4f}",
        )
    steps = [f"{cid}: step {r.step} {r.outcome}" for cid, r in state.resolutions.items()]
    table.add_row("ladder", "; ".join(steps) or "no call was in doubt")
    table.add_row("world", str(world.root))
    console.print(table)
    for check in checks:
        if not check.ok:
            console.print(f"[red]FAIL[/red] {check.name}: {check.reason}")
    style = "green" if passed == len(checks) else "red"
    console.print(f"[bold {style}]{passed}/{len(checks)} checks passed[/bold {style}]")
    verdicts = [{"name": c.name, "ok": c.ok, "reason": c.reason} for c in checks]
    # Replaced crash-atomically, never written through a link planted at the name.
    write_file(world.root / "checks.json", json.dumps(verdicts, indent=2).encode(), mode=0o600)
    return EXIT["done"] if passed == len(checks) else EXIT["checks"]
