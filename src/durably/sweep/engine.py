"""Restart until done: every sweep's scenario after its first kill, then its judging.

A sweep enumerates its kill points and kills the run's first process at one
(its kill method, :class:`~durably.sweep.process.Kill`); from there every
scenario is the same: restart, dying once more at ``spec.second`` if a second
kill is planned, until the run ends or :data:`MAX_RESTARTS` processes have
run; then :func:`~durably.sweep.judge.judge_scenario`.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from ..state import Phase, RunState
from .job import SweepJob
from .judge import ScenarioResult, ScenarioSpec, count_saved_turns, judge_scenario, paid_again
from .process import LABELS, Kill, was_killed
from .world import RUN_ID, World

__all__ = ["MAX_RESTARTS", "NOT_KILLED", "restart_and_judge"]

MAX_RESTARTS = 6

NOT_KILLED = "the restart was not killed"
"""How the error of an exact kill method's planned second kill that did not happen begins."""


def restart_and_judge(
    job: SweepJob,
    world: World,
    spec: ScenarioSpec,
    reference: Counter[str],
    error: str | None,
    *,
    record: bool = True,
    second_killed: int | None = None,
    kill: Kill = LABELS,
) -> ScenarioResult:
    """Restart (dying at ``spec.second`` the first time, if set) until the run ends; judge it.

    ``error`` is the first kill's (it did not happen as planned), kept before
    any of the restarts'. The first restart runs under ``kill`` (the sweep's
    kill method), the others unkilled. With ``record``, an uncrashed first
    restart records its points (the second crashes to come). ``second_killed``
    says the restart that dies at ``spec.second`` has run already (a chained
    kill, which left the world as it is) and gives the saved replies it paid
    for again.
    """
    log = job.call_log(world)
    paid_twice = second_killed or 0
    restart_record: dict[str, Any] | None = None
    finished = False
    final: RunState | None = None
    for restart in range(1 if second_killed is None else 2, MAX_RESTARTS + 1):
        saved_turns, asked = count_saved_turns(world), len(log.turns(RUN_ID))
        second = spec.second if restart == 1 else None
        recording = record and restart == 1 and second is None
        points = world.root / "restart.json" if recording else None
        method = kill if restart == 1 else LABELS
        status = method.process(job, world, first=False, at=second, record=points)
        paid_twice += paid_again(log, asked, saved_turns)
        if points is not None and points.exists():
            restart_record = json.loads(points.read_text())
        if second is not None:
            if was_killed(status):
                continue
            if kill.exact:
                error = error or f"{NOT_KILLED} where planned (status {status})"
        if status != 0:
            error = error or f"restart {restart} failed (status {status})"
            break
        final = world.read()
        finished = final.phase is Phase.DONE
        break
    else:
        if kill.exact:
            error = error or "the run did not finish"
    return judge_scenario(
        job, world, spec, reference, finished, paid_twice, restart_record, error, state=final
    )
