"""``durably triage``: run the reference triage agent, or carry on its unfinished run.

The state directory holds the checkpoints (``runs/``) and one world per run
(``worlds/<run>/``: the workspace, the tracker's database, the model's call
log). Running the same command again finds the task's unfinished run and
resumes it, saying where it stood.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .. import faults
from .._sysio import write_file
from ..approval import Approver, PolicyApprover, TerminalApprover
from ..errors import DurablyError, ModelError
from ..keys import new_run_id
from ..loop import Event, Limits, Outcome
from ..models.select import choose_model, resolve_spec
from ..state import Phase
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

    def __call__(self, event: Event) -> None:
        data, say = event.data, self.console.print
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
            step = {1: "rerun (harmless)", 2: "lookup", 3: "a person"}[data["step"]]
            say(
                f"  [magenta]in doubt[/magenta] {data['tool']} {data['call_id']}: "
                f"ladder step {data['step']} ({step}) -> {data['outcome']}"
            )
        elif event.kind in ("approved", "refused"):
            say(f"  approval for {data['tool']}: {event.kind}")
        elif event.kind == "resumed":
            say(
                f"[bold]resuming[/bold] {event.run_id}: phase {data['phase']}, "
                f"turn {data['turns']}, restart {data['resumes']}"
            )


def _find_unfinished(store: FileStore, task: str) -> str | None:
    """The newest run of ``task`` that is not done (run IDs sort by their UTC time)."""
    candidates = [r for r in store.list_runs_sync() if r.startswith(f"{task}-")]
    for run_id in reversed(candidates):
        try:
            state = store.read_sync(run_id)
        except DurablyError:
            # An unreadable run is never replaced by a fresh one: resume it and fail loudly.
            return run_id
        if state.phase is not Phase.DONE:
            return run_id
    return None


async def triage(args: argparse.Namespace, console: Console, errors: Console | None = None) -> int:
    """Run or resume the triage agent as the command line asked; return the exit code.

    Progress goes to ``console``; usage errors go to ``errors`` (default: stderr).
    """
    from ..cli import EXIT, runs_dir

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
    run_id = args.run or (None if args.new else _find_unfinished(store, args.task))
    resuming = run_id is not None
    if run_id is None:
        run_id = new_run_id(args.task)
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
        errors.print(f"[red]error:[/red] {exc}", soft_wrap=True, highlight=False)
        if not resuming:
            # Whatever of a world was made a moment ago belongs to no run.
            shutil.rmtree(worlds_dir(state_dir) / run_id, ignore_errors=True)
            errors.print("no run was started", highlight=False)
        return EXIT["failed"]
    except ModelError as exc:
        errors.print(f"[red]error:[/red] {exc}", soft_wrap=True, highlight=False)
        if not resuming:
            shutil.rmtree(world.root)  # made a moment ago for a run that never started
        return EXIT["usage"]

    approver: Approver = TerminalApprover() if args.approve == "on" else PolicyApprover()
    agent = build_agent(
        world=world,
        store=store,
        approver=approver,
        model=model,
        limits=Limits(max_turns=args.max_turns, max_dollars=args.max_dollars),
        observer=_Live(console),
    )
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
            console.print(f"[bold]new run[/bold] {run_id} ({args.task}, model {agent.model.name})")
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
    from ..cli import EXIT

    state = outcome.state
    if outcome.status == "paused":
        console.print(
            f"[yellow]paused[/yellow]: {len(outcome.pending)} question(s) wait for a person"
        )
        for pending in outcome.pending:
            console.print(f"  {pending.kind} {pending.tool} {pending.call_id}: {pending.why or ''}")
        console.print("run the same command again to answer them")
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
