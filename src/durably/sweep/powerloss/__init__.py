"""Power-loss mode: the disks a power cut may leave, and what the stores must load from them.

- :mod:`.model`: :class:`PowerLossFS`, a file system that performs every
  operation for real and keeps a model of what is durable, and the disk images
  a power cut may leave after any prefix of its op log;
- :mod:`.mutants`: seeded flaws of the store's save and lock protocols and of
  the workspace, each built on the real code (:data:`MUTANTS`);
- :mod:`.checks`: every power cut during a run's saves (or a workspace's
  writes), on every legal disk, loads as the last save that returned or the one
  in progress; and no two handles own a run at once;
- :mod:`.sweep`: the same for a whole job, each disk then resumed to the end
  and judged as the crash sweep judges (:func:`run_power_loss_sweep`), its
  report in :mod:`.report`.
"""

from .checks import WORKSPACE_FILE as WORKSPACE_FILE
from .checks import Exploration as Exploration
from .checks import Kind as Kind
from .checks import Violation as Violation
from .checks import check_lock_exclusion as check_lock_exclusion
from .checks import check_protocol as check_protocol
from .checks import check_store as check_store
from .checks import check_workspace as check_workspace
from .checks import explore as explore
from .checks import numbered_state as numbered_state
from .checks import workspace_content as workspace_content
from .model import DiskImage as DiskImage
from .model import Op as Op
from .model import PowerLossFS as PowerLossFS
from .mutants import MUTANTS as MUTANTS
from .mutants import Mutant as Mutant
from .mutants import mutant as mutant
from .sweep import STORES as STORES
from .sweep import PowerLossReport as PowerLossReport
from .sweep import PowerLossScenario as PowerLossScenario
from .sweep import run_power_loss_sweep as run_power_loss_sweep

__all__ = [
    "MUTANTS",
    "STORES",
    "WORKSPACE_FILE",
    "DiskImage",
    "Exploration",
    "Kind",
    "Mutant",
    "Op",
    "PowerLossFS",
    "PowerLossReport",
    "PowerLossScenario",
    "Violation",
    "check_lock_exclusion",
    "check_protocol",
    "check_store",
    "check_workspace",
    "explore",
    "mutant",
    "numbered_state",
    "run_power_loss_sweep",
    "workspace_content",
]
