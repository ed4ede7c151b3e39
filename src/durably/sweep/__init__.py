"""The crash sweep: SIGKILL a job at every crash point, restart it, count what went wrong.

See :mod:`durably.sweep.core` for how scenarios are built and judged, and
:mod:`durably.sweep.powerloss` for the power-cut model of the file store.
"""

from .core import CONFIGS as CONFIGS
from .core import Config as Config
from .core import Row as Row
from .core import ScenarioResult as ScenarioResult
from .core import SweepJob as SweepJob
from .core import SweepReport as SweepReport
from .core import Workers as Workers
from .core import World as World
from .core import assert_clean as assert_clean
from .core import digest_files as digest_files
from .core import run_sweep as run_sweep

__all__ = [
    "CONFIGS",
    "Config",
    "Row",
    "ScenarioResult",
    "SweepJob",
    "SweepReport",
    "Workers",
    "World",
    "assert_clean",
    "digest_files",
    "run_sweep",
]
