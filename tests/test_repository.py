"""What a fresh clone's two commands need: the system step first, and a clean checkout after."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from _helpers.patience import stretched

ROOT = Path(__file__).resolve().parent.parent


def dry_run(target: str) -> list[str]:
    """The commands ``make -n`` prints for ``target`` as if nothing were built yet."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    result = subprocess.run(
        ["make", "-n", "-B", "-C", str(ROOT), "--no-print-directory", target],
        capture_output=True,
        text=True,
        timeout=stretched(30),
        check=True,
    )
    return result.stdout.splitlines()


@pytest.mark.parametrize(("target", "mode"), [("demo", "demo"), ("test", "test")])
def test_make_runs_the_system_step_before_it_makes_the_virtualenv(target: str, mode: str) -> None:
    """``make demo`` and ``make test`` install system packages (Python's venv module among them)
    before anything runs Python to make ``.venv``, so a bare machine gets that far.
    """
    steps = dry_run(target)

    system = steps.index(f"scripts/system-deps {mode}")
    venv = next(i for i, step in enumerate(steps) if " -m venv " in step)
    assert system < venv, steps
    assert system == 0, steps


def test_what_the_readme_commands_write_in_a_checkout_is_ignored() -> None:
    """The CLI's default state directory, the sweep's reports and the example's state stay
    out of ``git status``.
    """
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    written = [
        ".durably/runs/r.json",
        ".durably-demo/runs/r.json",
        "sweep.txt",
        "sweep.json",
        "refund-demo/payments.json",
    ]
    result = subprocess.run(
        [
            "git",
            "-C",
            str(ROOT),
            "check-ignore",
            "--no-index",
            "--verbose",
            "--non-matching",
            *written,
        ],
        capture_output=True,
        text=True,
        timeout=stretched(30),
        check=False,
    )

    unignored = [
        line.split("\t")[-1] for line in result.stdout.splitlines() if line.startswith("::")
    ]
    assert unignored == [], result.stdout
    assert len(result.stdout.splitlines()) == len(written)


def fake_bin(tmp_path: Path, *, venv_module: bool) -> Path:
    """A PATH directory whose ``python3.11`` has (or lacks) ensurepip and whose user is not root."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python3.11"
    # Debian's python3.11 without python3.11-venv: the interpreter runs, ensurepip is absent.
    python.write_text(f"#!/bin/sh\nexit {0 if venv_module else 1}\n")
    uid = bin_dir / "id"
    uid.write_text("#!/bin/sh\necho 1000\n")  # not root: the script names what it would install
    for tool in (python, uid):
        tool.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("venv_module", [False, True])
def test_the_demo_system_step_looks_for_the_venv_module_not_only_the_interpreter(
    tmp_path: Path, venv_module: bool
) -> None:
    """On a bare Debian 12, python3.11 exists without its venv module: the demo's system
    step asks for python3.11-venv then, and asks for nothing once it is there.
    """
    bin_dir = fake_bin(tmp_path, venv_module=venv_module)
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "system-deps"), "demo"],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=stretched(30),
        check=False,
    )

    if venv_module:
        assert (result.returncode, result.stderr) == (0, "")
    else:
        assert result.returncode == 1
        assert result.stderr.startswith("missing: python3.11-venv;")
