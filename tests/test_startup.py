"""Start-up stays light: `import durably` and `durably --help` load no heavy module.

By module name, not by time: a timed test flickers on a shared machine, and the
times themselves are measured by benchmarks/startup.py.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib.metadata import version

import pytest

HEAVY = (
    "asyncio",  # imported where a run runs
    "rich",  # imported where a command draws
    "importlib.metadata",  # only for durably.__version__, on first use
    "email",  # importlib.metadata's
    "zipfile",
    "ssl",
    "socket",
    "subprocess",
    "sqlite3",  # the triage tracker's
    "concurrent",
    "psycopg",  # integrations: imported by the code that uses them
    "psycopg_pool",
    "anthropic",
    "openai",
    "mcp",
    "httpx",
    "stamina",  # retries: imported by the boundaries that retry, on first use
    "tenacity",
)


def modules_after(code: str) -> set[str]:
    """The modules loaded in a fresh interpreter once ``code`` has run (or exited)."""
    probe = (
        "import atexit, sys\n"
        "atexit.register(lambda: print(sorted(sys.modules), file=sys.stderr))\n" + code
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return set(ast.literal_eval(result.stderr.splitlines()[-1]))


def heavy(modules: set[str]) -> list[str]:
    """The heavy modules (or their submodules) among ``modules``."""
    return sorted(m for m in modules if m.split(".")[0] in HEAVY or m in HEAVY)


def test_import_durably_loads_no_heavy_module() -> None:
    """`import durably` loads none of asyncio, rich, importlib.metadata or an integration."""
    loaded = modules_after("import durably")

    assert "durably.loop" in loaded
    assert heavy(loaded) == []


@pytest.mark.parametrize("argv", [["--help"], ["triage", "--help"], ["sweep", "--help"]])
def test_command_help_loads_no_heavy_module(argv: list[str]) -> None:
    """`durably --help` and a command's --help draw nothing with rich and run no event loop."""
    loaded = modules_after(
        f"sys.argv = ['durably', *{argv!r}]\nfrom durably.cli import main\nmain()"
    )

    assert "durably.cli" in loaded
    assert heavy(loaded) == []


def test_the_version_is_read_on_first_use() -> None:
    """`durably.__version__` still gives the installed version, loading its reader then."""
    installed = version("durably")
    loaded = modules_after(f"import durably\nassert durably.__version__ == {installed!r}")

    assert "importlib.metadata" in loaded
