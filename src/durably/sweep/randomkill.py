"""The random sweep: SIGKILL the real demo at random wall-clock instants, several times a run.

Neither labels nor system calls choose the instant: a clock does. Each run of
the sweep is a job's command as a user runs it (for the triage demo,
``durably triage --approve off --model replay``: a fresh interpreter per
process, on its own state directory), killed at up to ``kills`` random
instants, each in a new process (so a kill can fall during a restart's
recovery as well as during the first process), then run again unkilled until
it finishes. It must end with all of its checks passed and, at the receivers
(for the demo, the tracker and the patch ledger), exactly the effects of an
uncrashed run: nothing duplicated, nothing lost. The job (a
:class:`~durably.sweep.job.CommandJob`: the sweep job protocol, run as a user
runs it, e.g. :class:`durably.triage.job.TriageJob`) hands over the command
and what a finished run left: its checks and its effects.

An instant is drawn uniformly from the length of one uncrashed process
(measured at the start of the sweep): a kill that would fall after the
process has finished does not happen (the run was done), and the run's
remaining kills are skipped. The seed makes every run's instants the same
again (``random.Random(f"{seed}:{run}")``); the timing of the machine decides
where in the program they land.
"""

from __future__ import annotations

import os
import random
import shlex
import signal
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .job import CommandJob, DemoOutcome
from .judge import duplicates_and_lost, judge_checks

__all__ = [
    "DemoJob",
    "DemoOutcome",
    "RandomReport",
    "RandomRun",
    "run_random_sweep",
]

DemoJob = CommandJob
"""The name the random sweep's job protocol had: :class:`durably.sweep.job.CommandJob`."""

STORES: tuple[str, ...] = ("journal", "snapshot")
_FINISH_ATTEMPTS = 4
_PROCESS_TIMEOUT = 120.0


@dataclass(frozen=True, kw_only=True)
class RandomRun:
    """One run of the demo and what its kills left."""

    run: int
    store: str
    instants: tuple[float, ...]
    """The kill instants drawn, seconds after each process started."""
    kills: int
    """How many of them happened (the process was still running)."""
    checks_passed: int
    checks_total: int
    failed_checks: tuple[str, ...]
    duplicates: int
    lost: int
    error: str | None = None

    @property
    def clean(self) -> bool:
        """Every check passed, nothing duplicated or lost, no error."""
        return (
            self.error is None
            and self.checks_total > 0
            and self.checks_passed == self.checks_total
            and not self.duplicates
            and not self.lost
        )


@dataclass(frozen=True, kw_only=True)
class RandomReport:
    """Every run of a random sweep."""

    job: str
    seed: int
    runs: tuple[RandomRun, ...]
    plain_seconds: float
    """The median length of one uncrashed process, from which instants are drawn."""

    def problems(self) -> list[str]:
        """Why the sweep fails: a run that is not clean (or no run at all)."""
        if not self.runs:
            return ["the random sweep ran no run"]
        found = []
        for r in self.runs:
            if not r.clean:
                why = (
                    r.error
                    or "; ".join(r.failed_checks)
                    or (f"{r.duplicates} duplicated, {r.lost} lost")
                )
                found.append(f"run {r.run} ({r.store}, {r.kills} kills): {why}")
        return found

    def text(self) -> str:
        """One line per run, then the totals."""
        lines = [
            f"random sweep of {self.job}: seed {self.seed}, {len(self.runs)} runs, "
            f"instants drawn from 0-{self.plain_seconds:.2f} s",
            f"{'run':>3} {'store':<8} {'kills':>5} {'checks':>7} {'duplicates':>10} {'lost':>4}"
            "  instants (s)",
        ]
        for r in self.runs:
            instants = " ".join(f"{t:.3f}" for t in r.instants[: max(r.kills, 1)])
            lines.append(
                f"{r.run:>3} {r.store:<8} {r.kills:>5} "
                f"{f'{r.checks_passed}/{r.checks_total}':>7} {r.duplicates:>10} {r.lost:>4}"
                f"  {instants}" + (f"  ERROR {r.error}" if r.error else "")
            )
        clean = sum(r.clean for r in self.runs)
        kills = sum(r.kills for r in self.runs)
        lines.append(f"{clean}/{len(self.runs)} runs clean, {kills} kills in all")
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        """The runs, for machines."""
        return {
            "job": self.job,
            "seed": self.seed,
            "plain_seconds": self.plain_seconds,
            "runs": [asdict(r) | {"clean": r.clean} for r in self.runs],
        }


def _environment() -> dict[str, str]:
    """The command's environment: no provider key, so only a recording can answer."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["PYTHONHASHSEED"] = "0"
    return env


def _process(command: Sequence[str], kill_at: float | None) -> tuple[bool, int, float]:
    """Run one process, SIGKILLing it at ``kill_at`` seconds: (killed, exit code, seconds)."""
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=_environment(),
    )
    try:
        process.wait(timeout=kill_at if kill_at is not None else _PROCESS_TIMEOUT)
    except subprocess.TimeoutExpired:
        if kill_at is None:
            process.kill()
            process.wait()
            raise RuntimeError(
                f"{shlex.join(command)} did not finish in {_PROCESS_TIMEOUT} s"
            ) from None
        process.send_signal(signal.SIGKILL)
        process.wait()
        return True, process.returncode, time.monotonic() - started
    return False, process.returncode, time.monotonic() - started


def _reference(job: CommandJob, store: str, scratch: str | None) -> tuple[Counter[str], float]:
    with tempfile.TemporaryDirectory(prefix="durably-random-", dir=scratch) as tmp:
        state = Path(tmp) / "state"
        _, code, seconds = _process(job.command(state, store), None)
        outcome = job.outcome(state)
        if code != 0 or outcome is None:
            raise RuntimeError(f"{job.name} on the {store} store did not finish (exit {code})")
        return outcome.effects, seconds


def _one_run(  # noqa: PLR0917 - private, one caller in this module
    job: CommandJob,
    run: int,
    store: str,
    seed: int,
    kills: int,
    plain: float,
    reference: Counter[str],
    scratch: str | None,
) -> RandomRun:
    rng = random.Random(f"{seed}:{run}")  # noqa: S311 - instants, not secrets
    instants = tuple(rng.uniform(0.0, plain) for _ in range(rng.randint(1, kills)))
    done_kills = 0
    error: str | None = None
    with tempfile.TemporaryDirectory(prefix="durably-random-", dir=scratch) as tmp:
        state = Path(tmp) / "state"
        command = job.command(state, store)
        code = None
        for instant in instants:
            killed, code, _ = _process(command, instant)
            if not killed:
                break
            done_kills += 1
        attempts = 0
        while code != 0 and attempts < _FINISH_ATTEMPTS:
            _, code, _ = _process(command, None)
            attempts += 1
        outcome = job.outcome(state)
        failed: tuple[str, ...] = ()
        passed = total = 0
        duplicates = lost = 0
        if outcome is None:
            error = f"the run never finished (last exit {code})"
        else:
            passed, total, failed = judge_checks(outcome.checks)
            duplicates, lost = duplicates_and_lost(reference, outcome.effects)
            if code != 0 and not failed:
                error = f"the last process exited {code}"
    return RandomRun(
        run=run,
        store=store,
        instants=instants,
        kills=done_kills,
        checks_passed=passed,
        checks_total=total,
        failed_checks=failed,
        duplicates=duplicates,
        lost=lost,
        error=error,
    )


def run_random_sweep(
    job: CommandJob,
    *,
    runs: int = 20,
    kills: int = 6,
    seed: int = 0,
    stores: Sequence[str] = STORES,
    jobs: int = 2,
    progress: Callable[[int, int], None] | None = None,
    scratch: str | None = None,
) -> RandomReport:
    """Kill a job's command at random instants; see the module docstring.

    Args:
        job: what to run and judge, e.g. ``TriageJob("m1-done-after-delete")``.
        runs: how many runs (they alternate between ``stores``).
        kills: at most this many kills per run (each run draws 1 to ``kills``).
        seed: makes the instants reproducible.
        stores: the stores the runs use, in turn.
        jobs: runs in parallel.
        progress: called with (runs done, runs in all).
        scratch: where the runs' state directories live (default: the temp directory).
    """
    if runs < 1 or kills < 1:
        raise ValueError("runs and kills must each be 1 or more")
    unknown = [s for s in stores if s not in STORES]
    if unknown or not stores:
        raise ValueError(f"stores are chosen from {', '.join(STORES)}, got {list(stores)}")
    references: dict[str, Counter[str]] = {}
    seconds: list[float] = []
    for store in stores:
        references[store], plain = _reference(job, store, scratch)
        seconds.append(plain)
    plain = statistics.median(seconds)
    results: list[RandomRun] = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [
            pool.submit(
                _one_run,
                job,
                run,
                stores[run % len(stores)],
                seed,
                kills,
                plain,
                references[stores[run % len(stores)]],
                scratch,
            )
            for run in range(runs)
        ]
        for future in futures:
            results.append(future.result())
            if progress is not None:
                progress(len(results), runs)
    return RandomReport(job=job.name, seed=seed, runs=tuple(results), plain_seconds=plain)
