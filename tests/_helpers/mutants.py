"""Seeded flaws of durably, each on the real code path, and what must catch each.

:data:`CATALOG` names every mutant: what it breaks, how (a monkeypatch of the
real function, or a seam flipped; never a rewritten copy of the code), and the
cheapest real test or sweep that must go red under it. ``tests/test_mutants.py``
runs each catcher in a child interpreter with the mutant installed and fails if
any mutant survives.

A child is started with ``DURABLY_MUTANT=<name>`` and ``PYTHONPATH`` holding
``mutant_site`` (whose ``sitecustomize`` calls :func:`install_from_environment`),
so the mutant is in that interpreter and in every process it forks or starts:
sweep workers, the loop tests' children. Each patched function records that it
ran in ``DURABLY_MUTANT_HITS``, so a mutant the catcher never reaches is not
counted as caught.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any
from unittest import mock

from durably.stores.journal import JournalRun

ENV = "DURABLY_MUTANT"
HITS_ENV = "DURABLY_MUTANT_HITS"


@contextmanager
def no_datasync() -> Iterator[None]:
    """Appends that skip their fdatasync: written to the page cache, never flushed."""
    original = JournalRun._append

    def append(self: JournalRun, record: bytes) -> None:
        sync, self._journal.sync = self._journal.sync, False
        try:
            original(self, record)
        finally:
            self._journal.sync = sync

    with mock.patch.object(JournalRun, "_append", append):
        yield


# -- what catches a mutant -------------------------------------------------------------


@dataclass(frozen=True)
class PytestNodes:
    """Pytest node IDs (relative to ``tests/``) of which at least one must fail."""

    nodes: tuple[str, ...]

    def describe(self) -> str:
        """The catcher, as the catalog lists it."""
        return "pytest " + " ".join(self.nodes)


@dataclass(frozen=True)
class Sweep:
    """A depth-1 crash sweep of the reference triage job under one configuration.

    Caught when the sweep's report has a problem (a row not clean, or not swept).
    """

    config: str

    def describe(self) -> str:
        """The catcher, as the catalog lists it."""
        return f"sweep --config {self.config!r} --depth 1"


@dataclass(frozen=True)
class Pending:
    """A mutant whose catcher arrives with another branch (named): not run here."""

    branch: str

    def describe(self) -> str:
        """The catcher, as the catalog lists it."""
        return f"pending: {self.branch}"


Catcher = PytestNodes | Sweep | Pending


@dataclass(frozen=True, kw_only=True)
class Mutant:
    """One seeded flaw: what it breaks, how it is installed, and what must catch it."""

    name: str
    flaw: str
    patches: Callable[[], list[tuple[Any, str, Any]]]
    """(owner, attribute, replacement) triples, built when installed (imports stay lazy)."""
    catcher: Catcher


def _hit(name: str) -> None:
    path = os.environ.get(HITS_ENV)
    if path:
        with open(path, "a") as out:
            out.write(f"{os.getpid()} {name}\n")


def _recording(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, noting in the hits file that the mutant ran."""
    if _is_coroutine(function):

        @functools.wraps(function)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            _hit(name)
            return await function(*args, **kwargs)

        return async_wrapper

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _hit(name)
        return function(*args, **kwargs)

    return wrapper


def _is_coroutine(function: Callable[..., Any]) -> bool:
    import inspect

    return inspect.iscoroutinefunction(function)


# -- the mutants -------------------------------------------------------------------------


def _powerloss(mutant: str) -> Callable[[], list[tuple[Any, str, Any]]]:
    """The power-loss model's own mutant (already on the real save path), by name."""

    def patches() -> list[tuple[Any, str, Any]]:
        from durably.sweep.powerloss import MUTANTS

        return list(MUTANTS[mutant].overrides)

    return patches


def _no_attempt_marker() -> list[tuple[Any, str, Any]]:
    from durably import engine, faults

    real = engine.RunSession.save

    async def save(self: Any, point: Any) -> None:
        if (
            point is engine.SavePoint.ATTEMPT
        ):  # the marker stays in memory only; the write goes ahead
            faults.point(point.crash_point)
            return
        await real(self, point)

    return [(engine.RunSession, "save", save)]


def _ladder_reruns_writes() -> list[tuple[Any, str, Any]]:
    from durably import ladder

    def key_is_live(*args: Any) -> bool:
        return True  # every in-doubt write "still has a live key": rerun at step 1

    return [(ladder, "key_is_live", key_is_live)]


def _restart_count_not_saved() -> list[tuple[Any, str, Any]]:
    from durably import engine

    real = engine.RunSession.count_restart

    async def count_restart(self: Any) -> None:
        async def not_saved(point: Any) -> None:
            return None

        self.save = not_saved  # the real count_restart, its save dropped
        try:
            await real(self)
        finally:
            del self.save

    return [(engine.RunSession, "count_restart", count_restart)]


def _saved_reply_dropped() -> list[tuple[Any, str, Any]]:
    from durably import engine
    from durably.state import AssistantMessage, Phase

    real = engine.RunSession.count_restart

    async def count_restart(self: Any) -> None:
        await real(self)
        state = self.state
        if state.phase is Phase.TOOLS and isinstance(state.messages[-1], AssistantMessage):
            # The saved reply whose calls are still to run is forgotten: asked for again.
            state.messages.pop()
            state.turns -= 1
            state.phase = Phase.MODEL

    return [(engine.RunSession, "count_restart", count_restart)]


def _damaged_record_as_torn_tail() -> list[tuple[Any, str, Any]]:
    from durably.stores import journal

    def damage_after(data: bytes, offset: int) -> str | None:
        return None  # nothing valid after a bad record: every bad record is a torn tail

    return [(journal, "_damage_after", damage_after)]


def _check_reads_wrong_run() -> list[tuple[Any, str, Any]]:
    import msgspec

    from durably.triage import checks

    def wrong_run(check: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
        def read_another_run(scene: Any) -> str | None:
            _hit("catalog check reads the wrong run")
            other = msgspec.structs.replace(scene.state, run_id=scene.state.run_id + "-other")
            return check(checks._Scene(**{**scene.__dict__, "state": other}))

        return read_another_run

    mutated = tuple(
        (name, wrong_run(check) if name == "no reply paid twice" else check)
        for name, check in checks.CHECKS
    )
    return [(checks, "CHECKS", mutated)]


def _workspace_unsynced() -> list[tuple[Any, str, Any]]:
    from durably.workspace import Workspace

    real = Workspace.__init__

    def init(self: Workspace, root: Any, *, sync: bool = True, **rest: Any) -> None:
        real(self, root, sync=False, **rest)  # the seam flipped: no write is ever fsynced

    return [(Workspace, "__init__", init)]


def _postgres_save_unfenced() -> list[tuple[Any, str, Any]]:
    from durably.postgres import _sql
    from durably.postgres import store as postgres

    unfenced = {}
    for name in ("SAVE_CHANGE", "SAVE_STATE"):  # a lone save: a change, or a snapshot
        statement = getattr(_sql, name)
        unfenced[name] = statement.replace("AND token = %(token)s ", "")
        if unfenced[name] == statement:
            raise RuntimeError(f"the save's UPDATE ({name}) has no token condition to remove")
    real = postgres.PostgresRun.save

    async def save(self: Any, state: Any) -> None:
        with mock.patch.multiple(_sql, **unfenced):
            await real(self, state)

    return [(postgres.PostgresRun, "save", save)]


def _postgres_group_save_unfenced() -> list[tuple[Any, str, Any]]:
    from durably.postgres import _sql
    from durably.postgres._groupcommit import GroupCommit

    unfenced = _sql.SAVE_MANY.replace("AND r.token = v.token ", "")
    if unfenced == _sql.SAVE_MANY:
        raise RuntimeError("the group save's UPDATE has no token condition to remove")
    real = GroupCommit._send_group

    async def send_group(self: Any, group: Any) -> None:
        with mock.patch.object(_sql, "SAVE_MANY", unfenced):
            await real(self, group)

    return [(GroupCommit, "_send_group", send_group)]


def _kill_does_nothing() -> list[tuple[Any, str, Any]]:
    from durably import faults

    real = faults.CrashPlan.hit

    def no_kill() -> None:
        _hit("a kill that does nothing")

    def hit(self: faults.CrashPlan, label: str) -> None:
        self.kill = no_kill  # the real hit, its kill a no-op
        real(self, label)

    return [(faults.CrashPlan, "hit", hit)]


CATALOG: tuple[Mutant, ...] = (
    Mutant(
        name="no directory fsync",
        flaw="the snapshot's directory is not synced after the rename",
        patches=_powerloss("no-dir-fsync"),
        catcher=PytestNodes(
            ("test_powerloss.py::test_the_real_protocol_survives_every_power_cut",)
        ),
    ),
    Mutant(
        name="no temp-file fsync",
        flaw="the snapshot's temp file is renamed into place without an fsync",
        patches=_powerloss("no-file-fsync"),
        catcher=PytestNodes(
            ("test_powerloss.py::test_the_real_protocol_survives_every_power_cut",)
        ),
    ),
    Mutant(
        name="snapshot written in place",
        flaw="the state file is truncated and rewritten in place",
        patches=_powerloss("write-in-place"),
        catcher=PytestNodes(
            ("test_powerloss.py::test_the_real_protocol_survives_every_power_cut",)
        ),
    ),
    Mutant(
        name="old snapshot unlinked before the rename",
        flaw="the state file is unlinked, then the temp file renamed into place",
        patches=_powerloss("unlink-then-rename"),
        catcher=PytestNodes(
            ("test_powerloss.py::test_the_real_protocol_survives_every_power_cut",)
        ),
    ),
    Mutant(
        name="lock file deleted on release",
        flaw="close unlinks the lock file (and open makes it again): two owners at once",
        patches=_powerloss("lock-deleted-on-release"),
        catcher=PytestNodes(("test_powerloss.py::test_the_real_store_never_has_two_owners",)),
    ),
    Mutant(
        name="no attempt marker before a write",
        flaw="the attempt save is skipped: a write the crash interrupted looks never started",
        patches=_no_attempt_marker,
        catcher=Sweep("no refile guard"),
    ),
    Mutant(
        name="ladder reruns writes at step 1",
        flaw="every in-doubt write is rerun blindly, as if its key were still live",
        patches=_ladder_reruns_writes,
        catcher=Sweep("no refile guard"),
    ),
    Mutant(
        name="restart count not saved",
        flaw="a restart counts itself in memory only: max_resumes never stops a crash loop",
        patches=_restart_count_not_saved,
        catcher=PytestNodes(
            (
                "loop/test_loop_limits.py::"
                "test_max_resumes_stops_the_eleventh_open_even_when_every_restart_dies",
            )
        ),
    ),
    Mutant(
        name="saved reply dropped on resume",
        flaw="a resumed run forgets the saved reply whose calls were running, and asks again",
        patches=_saved_reply_dropped,
        catcher=Sweep("keys honoured"),
    ),
    Mutant(
        name="damaged mid-log journal record read as torn tail",
        flaw="a bad record with valid records after it is cut off instead of refused",
        patches=_damaged_record_as_torn_tail,
        catcher=PytestNodes(
            ("test_store_journal.py::test_a_damaged_record_with_records_after_it_is_corrupt",)
        ),
    ),
    Mutant(
        name="catalog check reads the wrong run",
        flaw="'no reply paid twice' counts another run's model calls",
        patches=_check_reads_wrong_run,
        catcher=PytestNodes(
            (
                "triage/test_checks.py::"
                "test_each_check_fails_on_the_world_it_guards_against[no reply paid twice]",
            )
        ),
    ),
    Mutant(
        name="workspace without fsync",
        flaw="the workspace's sync seam is off: no written file or directory is fsynced",
        patches=_workspace_unsynced,
        catcher=PytestNodes(
            ("test_powerloss.py::test_the_real_workspace_survives_every_power_cut",)
        ),
    ),
    Mutant(
        name="Postgres save without the token condition",
        flaw="the save's UPDATE no longer checks the fencing token",
        patches=_postgres_save_unfenced,
        catcher=PytestNodes(
            (
                "stores/test_pg_fencing.py::"
                "test_a_stale_handle_whose_deadline_looks_fresh_is_refused_by_the_database",
            )
        ),
    ),
    Mutant(
        name="Postgres group save without the token condition",
        flaw="the UPDATE saving several runs at once no longer checks each row's fencing token",
        patches=_postgres_group_save_unfenced,
        catcher=PytestNodes(
            (
                "stores/test_pg_group_commit.py::"
                "test_a_group_mixing_a_fenced_run_and_live_ones_lands_only_the_live_ones",
            )
        ),
    ),
    Mutant(
        name="a kill that does nothing",
        flaw="a crash point's SIGKILL is a no-op: every scenario runs to the end uncrashed",
        patches=_kill_does_nothing,
        catcher=Sweep("keys honoured"),
    ),
)
"""Every seeded mutant of durably, with its catcher."""

BY_NAME = {mutant.name: mutant for mutant in CATALOG}


@contextmanager
def installed(name: str) -> Iterator[Mutant]:
    """Install the named mutant for the block (every patched function records its hits)."""
    mutant = BY_NAME[name]
    with ExitStack() as stack:
        for owner, attribute, replacement in mutant.patches():
            if callable(replacement):
                replacement = _recording(name, replacement)
            stack.enter_context(mock.patch.object(owner, attribute, replacement))
        yield mutant


_installed: ExitStack | None = None


def install_from_environment() -> None:
    """Install the mutant named by ``DURABLY_MUTANT`` for the rest of this process."""
    global _installed
    name = os.environ.get(ENV)
    if not name or _installed is not None:
        return
    _installed = ExitStack()
    _installed.enter_context(installed(name))
