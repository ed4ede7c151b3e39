"""Start-up stays light: `import durably` and `durably --help` load no heavy module.

By module name, not by time: a timed test flickers on a shared machine, and the
times themselves are measured by benchmarks/startup.py.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

import pytest

from _helpers.patience import stretched
from durably.state import RunState
from durably.stores.journal import JournalStore

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
    "opentelemetry",  # spans only when the application imported it and set a provider
)


def modules_after(code: str) -> set[str]:
    """The modules loaded in a fresh interpreter once ``code`` has run (or exited)."""
    probe = (
        "import atexit, sys\n"
        "atexit.register(lambda: print(sorted(sys.modules), file=sys.stderr))\n" + code
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=stretched(60),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return set(ast.literal_eval(result.stderr.splitlines()[-1]))


def heavy(modules: set[str]) -> list[str]:
    """The heavy modules (or their submodules) among ``modules``."""
    return sorted(m for m in modules if m.split(".")[0] in HEAVY or m in HEAVY)


NOT_FOR_READING = ("durably.loop", "durably.approval", "durably.models", "durably.ladder")
"""What running an agent needs and reading a store does not (``show``, ``runs``)."""


def ours(modules: set[str]) -> list[str]:
    """The durably modules among ``modules``, the package itself aside."""
    return sorted(m for m in modules if m.startswith("durably."))


def test_import_durably_loads_no_heavy_module() -> None:
    """`import durably` loads none of asyncio, rich, importlib.metadata or an integration."""
    loaded = modules_after("import durably")

    assert heavy(loaded) == []


def test_import_durably_loads_none_of_its_modules() -> None:
    """`import durably` loads no submodule: each public name loads its module on first use."""
    loaded = modules_after("import durably")

    assert "durably" in loaded
    assert ours(loaded) == []


def test_a_public_name_loads_its_module_and_nothing_heavy() -> None:
    """`from durably import Agent` loads the loop, still without a heavy module."""
    loaded = modules_after("from durably import Agent")

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
    # Nor does it read a store: no store, no state codec, no logging.
    assert not [m for m in ours(loaded) if m.startswith(("durably.stores", "durably.state"))]
    assert not {"msgspec", "logging"} & loaded
    # Nor shutil (and its compressors): argparse asks it for the terminal's width.
    assert not {"shutil", "bz2", "lzma"} & loaded


@pytest.fixture(scope="module")
def small_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A demo state directory whose store holds one run, ``r-1``."""
    state = tmp_path_factory.mktemp("startup")
    store = JournalStore(state / "runs", sync=False)
    created = datetime(2025, 1, 1, tzinfo=UTC)
    store.create_sync(RunState(run_id="r-1", task="t", created_at=created)).close_sync()
    store.close_sync()
    return state


READING = (["runs"], ["show", "r-1"])


@pytest.mark.parametrize("command", READING, ids=["runs", "show r-1"])
def test_reading_a_store_loads_no_agent_machinery(command: list[str], small_store: Path) -> None:
    """`durably runs` and `durably show` (both drawn as text by the listing) load no event
    loop, integration, loop, approval, model or ladder module.
    """
    argv = [*command, "--state", str(small_store)]
    loaded = modules_after(
        f"sys.argv = ['durably', *{argv!r}]\nfrom durably.cli import main\nmain()"
    )

    assert "durably.stores.journal" in loaded
    assert "durably.listing" in loaded  # it drew the table
    assert heavy(loaded) == []
    assert [m for m in ours(loaded) if m.startswith(NOT_FOR_READING)] == []
    # Nor logging (the stores log on rare paths only) or secrets (only new run IDs need it).
    assert not {"logging", "secrets"} & loaded
    # Nor the parsers and handlers of the other commands.
    assert "durably.cli.runs" in loaded
    assert [m for m in ours(loaded) if m.startswith("durably.cli.")] == [
        "durably.cli._args",
        "durably.cli.runs",
    ]


def test_every_command_is_in_the_table_that_loads_its_parser_alone() -> None:
    """The table the command line imports a command's module by lists exactly the commands the
    whole parser has; each parses with its own module's part alone, and a misspelt command
    gets the whole parser (to suggest from).
    """
    import argparse

    from durably import cli

    def commands(parser: argparse.ArgumentParser) -> set[str]:
        (action,) = [
            a
            for a in parser._actions  # noqa: SLF001 -- argparse keeps its subcommands there
            if isinstance(a, argparse._SubParsersAction)  # noqa: SLF001 -- as above
        ]
        return set(action.choices)

    every = commands(cli._parser())  # noqa: SLF001 -- the parser is what is tested
    listed = [name for _, _, names in cli.COMMANDS for name in names]
    assert sorted(listed) == sorted(every)
    for name in listed:
        alone = commands(cli._parser(["--debug", name, "--help"]))  # noqa: SLF001 -- as above
        assert name in alone
        assert alone < every
    assert commands(cli._parser(["shwo"])) == every  # noqa: SLF001 -- as above
    assert commands(cli._parser(["--help", "show"])) == every  # noqa: SLF001 -- as above


@pytest.mark.parametrize("command", READING, ids=["runs", "show r-1"])
def test_reading_a_store_loads_no_rich_threading_hashlib_or_signal(
    command: list[str], small_store: Path
) -> None:
    """`durably runs` and `durably show` write text: rich is not even loaded, unless to say an
    error; nor threading (a seal's scratch buffer), hashlib (idempotency keys) or signal
    (a test's crash point), which only running a store's writes needs; nor shutil, which
    argparse asks for the terminal's width.
    """
    argv = [*command, "--state", str(small_store)]
    loaded = modules_after(
        f"sys.argv = ['durably', *{argv!r}]\nfrom durably.cli import main\nmain()"
    )
    assert "durably.listing" in loaded
    assert heavy(loaded) == []
    assert not {"rich", "threading", "hashlib", "_hashlib", "signal", "shutil"} & loaded


def test_the_version_is_read_on_first_use() -> None:
    """`durably.__version__` still gives the installed version, loading its reader then."""
    installed = version("durably")
    loaded = modules_after(f"import durably\nassert durably.__version__ == {installed!r}")

    assert "importlib.metadata" in loaded
