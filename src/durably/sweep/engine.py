"""Restart until done: every scenario's processes after its first kill, then its judging."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from .. import faults
from ..state import Phase, RunState
from .job import SweepJob
from .judge import ScenarioResult, ScenarioSpec, count_saved_turns, judge_scenario, paid_again
from .process import run_scenario_process, was_killed
from .world import RUN_ID, World

__all__ = ["MAX_RESTARTS", "restart_and_judge"]

MAX_RESTARTS = 6


def restart_and_judge(
    job: SweepJob,
    world: World,
    spec: ScenarioSpec,
    reference: Counter[str],
    error: str | None,
    *,
    record: bool = True,
    second_killed: int | None = None,
) -> ScenarioResult:
    """Restart (dying at ``spec.second`` the first time, if set) until the run ends; judge it.

    With ``record``, an uncrashed first restart records its points (the
    second crashes to come). ``second_killed`` says the restart that dies at
    ``spec.second`` has run already (a chained kill, which left the world as
    it is) and gives the saved replies it paid for again.
    """
    log = job.call_log(world)
    paid_twice = second_killed or 0
    restart_record: dict[str, Any] | None = None
    finished = False
    final: RunState | None = None
    for restart in range(1 if second_killed is None else 2, MAX_RESTARTS + 1):
        saved_turns, asked = count_saved_turns(world), len(log.turns(RUN_ID))
        second = spec.second if restart == 1 else None
        plan = faults.CrashPlan(at=second) if second is not None else faults.CrashPlan()
        recording = record and restart == 1 and second is None
        points = world.root / "restart.json" if recording else None
        status = run_scenario_process(
            job, world, first=False, plan=plan, record=points, window_only=True
        )
        paid_twice += paid_again(log, asked, saved_turns)
        if points is not None and points.exists():
            restart_record = json.loads(points.read_text())
        if was_killed(status) and second is not None:
            continue
        if status != 0:
            error = error or f"restart {restart} failed (status {status})"
            break
        final = world.read()
        finished = final.phase is Phase.DONE
        break
    return judge_scenario(
        job, world, spec, reference, finished, paid_twice, restart_record, error, state=final
    )
