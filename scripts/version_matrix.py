"""The integration extras' oldest allowed versions, tested: the `make test` step after pytest.

``make test`` runs the whole suite in ``.venv``, where pip installed the newest
version each extra's range allows. This step makes ``.venv-oldest`` with the lowest
version each range allows (its ``>=`` bound, installed with ``pip --constraint``),
then runs the front ends' tests there: tests/pydantic_ai and tests/openai_agents,
without their slow sweeps and peer comparisons and without the Postgres store's
(those test durability, not the SDK's seams, and run in ``.venv``). It prints the
versions each environment tested.

The ranges are read from pyproject.toml, so a raised or lowered bound is what gets
tested. ``.venv-oldest`` is made again only when the pins change.

Run: ``python3.11 scripts/version_matrix.py [--python python3.11]`` from the checkout.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
OLDEST = ROOT / ".venv-oldest"
NEWEST = ROOT / ".venv"
EXTRAS = ("pydantic-ai", "openai-agents")
"""The front ends' extras whose SDK ranges are tested at both ends."""
TESTS = ("tests/pydantic_ai", "tests/openai_agents")
SELECT = "not slow and not postgres"
TEST_TOOLS = ("pytest>=8.3", "pytest-timeout>=2.3", "hypothesis>=6.100", "typing-extensions>=4.4")
"""What the front ends' tests need besides durably and its extras (a subset of ``dev``)."""


def lowest_pins() -> dict[str, str]:
    """Each front-end extra's SDK pinned to its range's ``>=`` bound, by distribution name."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins: dict[str, str] = {}
    for extra in EXTRAS:
        for requirement in project["optional-dependencies"][extra]:
            name, _, spec = requirement.partition(">=")
            if not spec:
                raise SystemExit(
                    f"pyproject.toml: the {extra!r} extra's {requirement!r} has no >= bound; "
                    "give it one (the oldest version the adapter is tested at)"
                )
            pins[name.strip()] = spec.split(",")[0].strip()
    return pins


def versions(python: Path, names: list[str]) -> dict[str, str]:
    """The version of each distribution installed for ``python``, by name."""
    code = (
        "import sys, importlib.metadata as m; print(' '.join(m.version(n) for n in sys.argv[1:]))"
    )
    found = subprocess.run(
        [str(python), "-c", code, *names], capture_output=True, text=True, check=True
    )
    return dict(zip(names, found.stdout.split(), strict=True))


def said(found: dict[str, str]) -> str:
    """``name version, ...``."""
    return ", ".join(f"{name} {version}" for name, version in found.items())


def make_oldest(python: str, pins: dict[str, str]) -> None:
    """Make ``.venv-oldest`` with the pins, unless it was made with these pins already."""
    constraints = "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))
    made = OLDEST / "constraints.txt"
    if made.exists() and made.read_text() == constraints:
        return
    print(f"making {OLDEST.name} with {', '.join(constraints.split())} (a minute; once)")
    shutil.rmtree(OLDEST, ignore_errors=True)
    subprocess.run([python, "-m", "venv", str(OLDEST)], check=True)
    pip = [str(OLDEST / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    (OLDEST / "pins.txt").write_text(constraints)
    subprocess.run(
        [
            *pip,
            "--constraint",
            str(OLDEST / "pins.txt"),
            "-e",
            f"{ROOT}[{','.join(EXTRAS)},postgres]",
            *TEST_TOOLS,
        ],
        check=True,
    )
    made.write_text(constraints)  # last: a failed install is made again next time


def main() -> None:
    """Make the oldest environment if needed, run the front ends' tests there, say what ran."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="python3.11", help="the interpreter for the venv")
    args = parser.parse_args()
    pins = lowest_pins()
    started = time.perf_counter()
    make_oldest(args.python, pins)
    made = time.perf_counter() - started
    names = sorted(pins)
    tested = subprocess.run(
        [str(OLDEST / "bin" / "pytest"), "-q", "-p", "no:cacheprovider", "-m", SELECT, *TESTS],
        cwd=ROOT,
        check=False,
    )
    oldest = versions(OLDEST / "bin" / "python", names)
    print(f"oldest allowed ({OLDEST.name}): {said(oldest)}")
    for name, pin in pins.items():
        if Version(oldest[name]) != Version(pin):
            raise SystemExit(f"{OLDEST.name} has {name} {oldest[name]}, not {pin}: remove it")
    if (NEWEST / "bin" / "python").exists():
        newest = versions(NEWEST / "bin" / "python", names)
        print(f"newest allowed ({NEWEST.name}, the whole suite): {said(newest)}")
    print(
        f"version matrix: {made:.0f} s making {OLDEST.name}, "
        f"{time.perf_counter() - started - made:.0f} s testing"
    )
    sys.exit(tested.returncode)


if __name__ == "__main__":
    main()
