"""Puts this directory on the import path for its world module, as pytest does for test files."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
