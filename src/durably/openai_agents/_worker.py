"""The Agents SDK agent as a worker drives it: :func:`worker_agent` and :class:`WorkerAgent`."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from agents import Agent, RunConfig

from .. import frontend
from ..engine import Outcome
from ..errors import RunCancelled
from ..state import (
    RunState,
)
from ..stores import RunHandle
from ._runner import DurableRunner, RunPaused, _check_options, _task_text

__all__ = ["WorkerAgent", "worker_agent"]


class WorkerAgent(frontend.Delegating):
    """An Agents SDK agent with its :class:`DurableRunner`, driven on a handle its caller owns.

    What a Postgres worker runs (``durably.postgres.register("refunds", lambda run_id:
    worker_agent(build_agent(), DurableRunner(None, effects=...)))``) and what ``durably
    resume RUN STORE --agent MODULE:FACTORY`` resumes: :meth:`start` saves a new run's
    first state through the handle and runs the agent; :meth:`drive` carries a saved run
    on with its saved task. Both return the run's :class:`~durably.Outcome` (a run that
    waits for a person is ``paused``, not an exception), as ``durably.Agent`` does. The
    runner's own store is not used. Build it with :func:`worker_agent`.
    """

    def __init__(
        self,
        agent: Agent[Any],
        runner: DurableRunner,
        run_config: RunConfig | None,
        options: Mapping[str, Any],
    ) -> None:
        self.agent, self.runner = agent, runner
        self._front = runner
        self.run_config, self.options = run_config, dict(options)

    async def start(self, handle: RunHandle, task: str) -> Outcome:
        """Start a new run of ``task`` on ``handle``, which owns a run ID with no state yet.

        The first state is saved through ``handle`` (save point 1), then the agent
        runs until it is done or paused. The caller owns ``handle`` and closes it.
        """
        state = await frontend.started_run(handle, _task_text(task), clock=self.runner.clock)
        return await self._drive(handle, state, fresh=True)

    async def drive(self, handle: RunHandle, state: RunState) -> Outcome:
        """Carry a run on from ``state``, its last save, through ``handle``.

        The restart is counted and the agent's fingerprint checked as on any resume.
        The caller owns ``handle`` and closes it.

        Raises:
            ValueError: ``state`` is not the state of ``handle``'s run.
        """
        finished = frontend.given_run(handle, state)
        if finished is not None:
            return finished
        return await self._drive(handle, state, fresh=False)

    async def _drive(self, handle: RunHandle, state: RunState, *, fresh: bool) -> Outcome:
        # Saved as paused, or as cancelled (`durably cancel`): the outcome says so.
        with contextlib.suppress(RunPaused, RunCancelled):
            await self.runner._drive(  # noqa: SLF001 - the runner's own seam, kept private
                self.agent,
                handle,
                state,
                fresh=fresh,
                run_config=self.run_config,
                options=self.options,
            )
        return Outcome.from_state(state)


def worker_agent(
    agent: Agent[Any],
    runner: DurableRunner,
    *,
    run_config: RunConfig | None = None,
    **runner_options: Any,
) -> WorkerAgent:
    """``agent`` run by ``runner`` as a worker drives it (a :class:`~durably.frontend.Drivable`).

    Register it with a Postgres worker (``durably.postgres.register(name, lambda run_id:
    worker_agent(build(), DurableRunner(None, effects=...)))``) or name its factory in
    ``durably resume --agent``. ``run_config`` and ``runner_options`` go to every
    ``Runner.run`` (``context=...``, ``max_turns=...``).

    Raises:
        TypeError: ``agent`` is not an Agents SDK agent, or ``runner`` not a DurableRunner.
        ValueError: ``runner_options`` holds ``session`` or ``previous_response_id``.
    """
    if not isinstance(agent, Agent):
        raise TypeError(
            f"worker_agent takes an agents.Agent, got {type(agent).__name__}; a "
            "durably.Agent is registered as it is"
        )
    if not isinstance(runner, DurableRunner):
        raise TypeError(
            f"worker_agent runs the agent through a DurableRunner, got {type(runner).__name__}: "
            "pass DurableRunner(None, effects=...) (a worker gives it each run's handle)"
        )
    _check_options(runner_options)
    return WorkerAgent(agent, runner, run_config, runner_options)
