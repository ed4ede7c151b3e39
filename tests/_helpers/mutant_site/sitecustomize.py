"""Installs the mutant named by ``DURABLY_MUTANT`` in every interpreter that starts.

Only on ``PYTHONPATH`` in the children ``tests/test_mutants.py`` starts (with the
``tests`` directory beside it), so the mutant reaches every process they start.
"""

import os

if os.environ.get("DURABLY_MUTANT"):
    from _helpers.mutants import install_from_environment

    install_from_environment()
