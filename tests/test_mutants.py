"""Mutants as a permanent test: every seeded flaw of durably is caught by what the catalog names.

Each mutant (``_helpers/mutants.py``) breaks the real code path, and each is run
against its catcher in a child interpreter that has the mutant installed in
itself and in every process it starts: a pytest run of named tests (caught when
they fail), or ``durably sweep --config C --depth 1`` through the real CLI
(caught when it exits 1 and its JSON says not ok). A mutant whose patched code
never ran under its catcher counts as surviving.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from _helpers.mutants import BY_NAME, CATALOG, ENV, HITS_ENV, Pending, PytestNodes, Sweep, installed
from _helpers.patience import stretched

TESTS = Path(__file__).parent
ROOT = TESTS.parent
SITE = TESTS / "_helpers" / "mutant_site"

REQUIRED = {
    "no directory fsync",
    "no temp-file fsync",
    "no attempt marker before a write",
    "ladder reruns writes at step 1",
    "restart count not saved",
    "saved reply dropped on resume",
    "damaged mid-log journal record read as torn tail",
    "catalog check reads the wrong run",
    "workspace without fsync",
    "Postgres save without the token condition",
    "a kill that does nothing",
    "lock file deleted on release",
}
"""The mutants issue 14 names; the catalog may hold more."""

RUNNABLE = [m.name for m in CATALOG if not isinstance(m.catcher, Pending)]


def _environment(name: str, hits: Path) -> dict[str, str]:
    env = dict(os.environ)
    env[ENV] = name
    env[HITS_ENV] = str(hits)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(SITE), str(TESTS), env.get("PYTHONPATH", "")) if p
    )
    return env


def _catch(name: str, scratch: Path) -> tuple[bool, str]:
    """Run the mutant's catcher with the mutant installed: (caught, evidence)."""
    catcher = BY_NAME[name].catcher
    env = _environment(name, scratch / "hits")
    if isinstance(catcher, PytestNodes):
        nodes = [str(TESTS / node) for node in catcher.nodes]
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *nodes]
        done = subprocess.run(
            command,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=stretched(600),
            check=False,
        )
        failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
        # 1 is pytest's "some tests failed"; a usage or collection error proves nothing.
        return done.returncode == 1 and bool(failed), "\n".join(failed) or done.stdout[-2000:]
    assert isinstance(catcher, Sweep)
    report = scratch / "sweep.json"
    command = [
        *(sys.executable, "-m", "durably", "sweep", "--depth", "1", "--jobs", "2"),
        *("--config", catcher.config, "--json", str(report)),
    ]
    done = subprocess.run(
        command,
        cwd=scratch,
        env=env,
        capture_output=True,
        text=True,
        timeout=stretched(600),
        check=False,
    )
    if not report.exists():
        return False, f"no report (exit {done.returncode}): {done.stderr[-2000:]}"
    found = json.loads(report.read_text())
    caught = done.returncode == 1 and not found["ok"] and bool(found["problems"])
    return caught, "; ".join(found["problems"][:2]) or done.stderr[-2000:]


def test_the_catalog_holds_every_mutant_the_issue_names() -> None:
    """Every mutant issue 14 asks for is in the catalog, each with a catcher."""
    assert set(BY_NAME) >= REQUIRED
    assert len(BY_NAME) == len(CATALOG)


def test_no_mutant_waits_for_a_catcher() -> None:
    """Every mutant in the catalog is run against its catcher here; none is pending."""
    pending = {m.name for m in CATALOG if isinstance(m.catcher, Pending)}
    assert pending == set()

    from durably.workspace import Workspace

    with installed("workspace without fsync"):
        assert Workspace(ROOT, sync=True).sync is False
    assert Workspace(ROOT, sync=True).sync is True


@pytest.fixture(scope="module")
def catches(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[tuple[bool, str, str]]]]:
    """Every selected mutant's catcher, started two at a time (each is a child process tree)."""
    wanted = [
        str(item.callspec.params["name"])
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.originalname == "test_each_mutant_is_caught_by_what_the_catalog_names"
    ]

    def run(name: str) -> tuple[bool, str, str]:
        scratch = tmp_path_factory.mktemp("mutant")
        caught, evidence = _catch(name, scratch)
        hits = scratch / "hits"
        return caught, evidence, hits.read_text() if hits.exists() else ""

    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {name: pool.submit(run, name) for name in wanted}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", RUNNABLE)
def test_each_mutant_is_caught_by_what_the_catalog_names(
    name: str, catches: dict[str, Future[tuple[bool, str, str]]]
) -> None:
    """The mutant's catcher goes red with the mutant installed, and the mutant's code ran."""
    caught, evidence, reached = catches[name].result()
    describe = BY_NAME[name].catcher.describe()
    assert reached, f"{name}: never reached by {describe}"
    assert caught, f"{name} SURVIVED {describe}:\n{evidence}"
    print(f"{name}: caught by {describe}: {evidence.splitlines()[0][:200]}")
