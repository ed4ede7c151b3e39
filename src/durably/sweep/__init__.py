"""The crash sweeps: kill a job at every kill point, restart it until done, count what went wrong.

One scenario engine serves every sweep: :mod:`.world` (a scenario's world),
:mod:`.job` (the job protocol), :mod:`.process` (forked children, the recorder
and the kill-method protocol), :mod:`.engine` (restart until done), :mod:`.judge`
(one judge, one duplicate/lost rule), :mod:`.report` (the report protocol) and
:mod:`.pool` (warm workers). Each sweep only enumerates its kill points and
kills at one: :mod:`durably.sweep.labelled` at labelled crash points (its
batches and chains in :mod:`.batch`), :mod:`durably.sweep.syscalls` at every
disk-changing system call (strace, :mod:`.strace`), :mod:`durably.sweep.powerloss`
at power cuts of a modelled file system, :mod:`durably.sweep.randomkill` at
random instants of the demo's command. :mod:`durably.sweep.tree` keeps a
directory tree in memory and lays it down again (a scenario's disk, a job's
fresh world).
"""

from .config import CONFIGS as CONFIGS
from .config import Config as Config
from .job import SweepApprover as SweepApprover
from .job import SweepJob as SweepJob
from .judge import ScenarioResult as ScenarioResult
from .labelled import assert_clean as assert_clean
from .labelled import run_sweep as run_sweep
from .pool import Workers as Workers
from .process import run_in_child as run_in_child
from .randomkill import run_random_sweep as run_random_sweep
from .report import Row as Row
from .report import SweepReport as SweepReport
from .syscalls import assert_syscalls_clean as assert_syscalls_clean
from .syscalls import run_syscall_sweep as run_syscall_sweep
from .world import RUN_ID as RUN_ID
from .world import StoreFactory as StoreFactory
from .world import World as World
from .world import digest_files as digest_files
from .world import scratch_root as scratch_root

__all__ = [
    "CONFIGS",
    "RUN_ID",
    "Config",
    "Row",
    "ScenarioResult",
    "StoreFactory",
    "SweepApprover",
    "SweepJob",
    "SweepReport",
    "Workers",
    "World",
    "assert_clean",
    "assert_syscalls_clean",
    "digest_files",
    "run_in_child",
    "run_random_sweep",
    "run_sweep",
    "run_syscall_sweep",
    "scratch_root",
]
