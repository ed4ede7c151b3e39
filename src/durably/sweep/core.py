"""The labelled crash sweep's names in one place, as they were before the engine was split.

The sweep's jobs each have their module now: :mod:`.config` (configurations),
:mod:`.world` (a scenario's world), :mod:`.job` (the job protocol),
:mod:`.process` (forked children and the recorder), :mod:`.engine` (restart
until done), :mod:`.judge` (judging), :mod:`.batch` (batching and chains),
:mod:`.report` (the table), :mod:`.pool` (the workers) and :mod:`.labelled`
(the labelled sweep). This module re-exports them for code that imports
``durably.sweep.core``.
"""

from .config import CONFIGS as CONFIGS
from .config import Config as Config
from .engine import MAX_RESTARTS as MAX_RESTARTS
from .engine import restart_and_judge as restart_and_judge
from .job import SweepAgent as SweepAgent
from .job import SweepApprover as SweepApprover
from .job import SweepJob as SweepJob
from .judge import ScenarioResult as ScenarioResult
from .judge import ScenarioSpec as ScenarioSpec
from .judge import count_saved_turns as count_saved_turns
from .judge import judge_scenario as judge_scenario
from .labelled import assert_clean as assert_clean
from .labelled import run_sweep as run_sweep
from .pool import Workers as Workers
from .pool import check_jobs as check_jobs
from .pool import scenario_workers as scenario_workers
from .process import WINDOW_END as WINDOW_END
from .process import run_in_child as run_in_child
from .process import run_scenario_process as run_scenario_process
from .process import was_killed as was_killed
from .report import Row as Row
from .report import SweepReport as SweepReport
from .world import RUN_ID as RUN_ID
from .world import StoreFactory as StoreFactory
from .world import World as World
from .world import digest_files as digest_files
from .world import scratch_root as scratch_root

__all__ = [
    "CONFIGS",
    "MAX_RESTARTS",
    "RUN_ID",
    "WINDOW_END",
    "Config",
    "Row",
    "ScenarioResult",
    "ScenarioSpec",
    "StoreFactory",
    "SweepAgent",
    "SweepApprover",
    "SweepJob",
    "SweepReport",
    "Workers",
    "World",
    "assert_clean",
    "check_jobs",
    "count_saved_turns",
    "digest_files",
    "judge_scenario",
    "restart_and_judge",
    "run_in_child",
    "run_scenario_process",
    "run_sweep",
    "scenario_workers",
    "scratch_root",
    "was_killed",
]
