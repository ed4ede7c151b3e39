"""The store conformance suite: the rules a store must keep, for a store you write.

A store you write (Redis, S3, your company's database) plugs into durably through
the two protocols of :mod:`durably.stores`, :class:`~durably.stores.Store` and
:class:`~durably.stores.RunHandle`. The protocols say what the methods are
called; these checks say what they must do, as Temporal's ``temporalio.testing``
does for its workers. durably's own stores (the snapshot, journal and directory
file stores, Postgres, and the LangGraph saver's thread store) pass every check
in durably's CI.

Give the suite a :class:`StoreUnderTest`: how to make a store object (a new one
each call, all on the same place, empty at first), and optionally how to reach
under it (plant bytes as a run's stored state, read them back). Each
:class:`Check` in :data:`CHECKS` is one rule; run them with pytest::

    import pytest
    from durably.testing.stores import CHECKS, Check, StoreUnderTest

    @pytest.fixture
    def subject(tmp_path):
        return StoreUnderTest(name="mine", make=lambda: MyStore(tmp_path / "runs"))

    @pytest.mark.parametrize("check", CHECKS, ids=str)
    def test_my_store_keeps_the_rule(check: Check, subject: StoreUnderTest) -> None:
        check.run(subject)

A broken rule raises :class:`ConformanceError` (an ``AssertionError``) naming
the check and what the store did. A check that needs ``plant`` and ``raw`` is
skipped (``unittest.SkipTest``, which pytest reports as a skip) when they are
not given. What no in-process check can see, and the suite therefore does not
claim: that a save survives a power cut (every fsync in its place; durably's
power-loss sweep shows it for the file stores), and that the lock of a process
that dies is released (kill a real owner with SIGKILL in a test of your own).
"""

from __future__ import annotations

import asyncio
import random
import unittest
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from ..checkpoint.envelope import seal
from ..errors import (
    CheckpointCorrupt,
    CheckpointTooNew,
    InvalidRunId,
    Locked,
    RunExists,
    RunNotFound,
)
from ..state import FORMAT, Phase, RunState
from ..stores import RunHandle, Store
from .states import first_state, full_state, grown_state

__all__ = [
    "CHECKS",
    "Check",
    "ConformanceError",
    "StoreUnderTest",
    "first_state",
    "full_state",
    "grown_state",
]

_T = TypeVar("_T")


class ConformanceError(AssertionError):
    """A store broke a rule of the suite; the message names the check and what the store did."""


@dataclass(frozen=True, kw_only=True)
class StoreUnderTest:
    """A store for the suite: how to make it, and optionally how to reach under it.

    Args:
        name: the store's name in failure messages.
        make: a new store object on the store's place (a directory, a schema):
            every call the same place, empty before the check's first call. The
            suite uses each object with ``async with`` and makes several, so that
            what one wrote is read back through another.
        plant: make these bytes what the store keeps as the run's whole state
            (for the checks that damage a checkpoint); None skips those checks.
        raw: what the store keeps as the run's state, byte for byte (to see that
            a damaged checkpoint was left as it was); None skips those checks.
        encode: how a state becomes the stored bytes ``plant`` is given when a
            check plants a readable state: durably's sealed envelope unless told.
    """

    name: str
    make: Callable[[], Store]
    plant: Callable[[str, bytes], None] | None = None
    raw: Callable[[str], bytes] | None = None
    encode: Callable[[RunState], bytes] = seal


@dataclass(frozen=True)
class Check:
    """One rule of the suite: ``run`` it against a store (``arun`` inside an event loop)."""

    name: str
    rule: str
    """The rule, in one sentence."""
    scenario: Callable[[StoreUnderTest], Awaitable[None]]
    reaches_under: bool = False
    """Needs the store's ``plant`` and ``raw``."""

    def __str__(self) -> str:
        return self.name

    def run(self, subject: StoreUnderTest) -> None:
        """Check the rule in a new event loop.

        Raises:
            ConformanceError: the store broke it.
            unittest.SkipTest: the check needs ``plant`` and ``raw``, and the subject has none.
        """
        asyncio.run(self.arun(subject))

    async def arun(self, subject: StoreUnderTest) -> None:
        """Check the rule in the running event loop (see :meth:`run`)."""
        if self.reaches_under and (subject.plant is None or subject.raw is None):
            raise unittest.SkipTest(f"{self.name} needs the store's plant and raw hooks")
        try:
            await self.scenario(subject)
        except ConformanceError as exc:
            raise ConformanceError(f"{subject.name} breaks {self.name}: {exc}") from exc


# -- helpers ------------------------------------------------------------------------------


def _fail(message: str) -> ConformanceError:
    """The error for a broken rule (the check's name is added by :meth:`Check.arun`)."""
    return ConformanceError(message)


def _same(found: RunState, wanted: RunState, what: str) -> None:
    """``found`` is ``wanted`` field for field (the store's ``saved_at`` aside)."""
    have = msgspec.structs.asdict(found)
    want = msgspec.structs.asdict(wanted)
    differ = sorted(name for name in want if name != "saved_at" and have[name] != want[name])
    if differ:
        name = differ[0]
        raise _fail(
            f"{what} differs from the state saved in field(s) {', '.join(differ)} "
            f"({name}: saved {want[name]!r}, got {have[name]!r})"
        )


async def _refused(
    what: str, expected: type[BaseException] | tuple[type[BaseException], ...], act: Awaitable[_T]
) -> BaseException:
    """The exception ``act`` raises, which must be one of ``expected``."""
    wanted = expected if isinstance(expected, tuple) else (expected,)
    names = " or ".join(kind.__name__ for kind in wanted)
    try:
        result = await act
    except wanted as exc:
        return exc
    except Exception as exc:
        raise _fail(f"{what} raised {type(exc).__name__} ({exc}), not {names}") from exc
    if isinstance(result, tuple) and result and isinstance(result[0], RunHandle):
        await result[0].close()
    elif isinstance(result, RunHandle):
        await result.close()
    raise _fail(f"{what} succeeded; it must raise {names}")


def _names(exc: BaseException, run_id: str, what: str) -> None:
    if getattr(exc, "run_id", None) != run_id:
        raise _fail(f"{what} raised {type(exc).__name__} without run_id={run_id!r}: {exc}")


async def _created(store: Store, state: RunState) -> None:
    await (await store.create(state)).close()


async def _loaded(subject: StoreUnderTest, run_id: str) -> RunState:
    """The run's state as a new store object opens it."""
    async with subject.make() as store:
        handle, state = await store.open(run_id)
        await handle.close()
        return state


def _planted(subject: StoreUnderTest, run_id: str, data: bytes) -> None:
    if subject.plant is None:  # pragma: no cover - Check.arun skips first
        raise unittest.SkipTest("no plant hook")
    subject.plant(run_id, data)


def _raw(subject: StoreUnderTest, run_id: str) -> bytes:
    if subject.raw is None:  # pragma: no cover - Check.arun skips first
        raise unittest.SkipTest("no raw hook")
    return subject.raw(run_id)


# -- the checks -----------------------------------------------------------------------------


async def _create_then_open(subject: StoreUnderTest) -> None:
    async with subject.make() as store:
        if not isinstance(store, Store):
            raise _fail(f"make() gave {type(store).__name__}, which lacks the Store protocol")
        handle = await store.create(first_state("r1"))
        if not isinstance(handle, RunHandle) or handle.run_id != "r1":
            raise _fail(f"create gave {handle!r}, not a RunHandle for run 'r1'")
        await handle.close()
        handle, opened = await store.open("r1")
        await handle.close()
        read = await store.read("r1")
    _same(opened, first_state("r1"), "the created run, opened,")
    _same(read, first_state("r1"), "the created run, read,")
    if opened.saved_at is None:
        raise _fail("a loaded state has no saved_at: the store must stamp the time of each save")


async def _every_field(subject: StoreUnderTest) -> None:
    async with subject.make() as store, await store.create(first_state("r1")) as handle:
        await handle.save(full_state("r1"))
        _same(await store.read("r1"), full_state("r1"), "the run read while open")
    _same(await _loaded(subject, "r1"), full_state("r1"), "the run opened again")


async def _newest_save(subject: StoreUnderTest) -> None:
    async with subject.make() as store, await store.create(first_state("r1")) as handle:
        for state in (full_state("r1"), grown_state("r1", 50_000), first_state("r1")):
            await handle.save(state)
        await handle.save(full_state("r1"))
    _same(await _loaded(subject, "r1"), full_state("r1"), "after four saves, the run")
    async with subject.make() as store:
        handle, _ = await store.open("r1")
        for turn in range(3):
            state = full_state("r1")
            state.turns = turn
            await handle.save(state)
        await handle.close()
    if (await _loaded(subject, "r1")).turns != 2:
        raise _fail("the last of three saves is not what the next open loads")


async def _no_second_create(subject: StoreUnderTest) -> None:
    async with subject.make() as store:
        handle = await store.create(first_state("r1"))
        await handle.save(full_state("r1"))
        exc = await _refused(
            "creating an open run again", (RunExists, Locked), store.create(first_state("r1"))
        )
        _names(exc, "r1", "creating an open run again")
        await handle.close()
        exc = await _refused(
            "creating a closed run again", RunExists, store.create(first_state("r1"))
        )
        _names(exc, "r1", "creating a closed run again")
    _same(await _loaded(subject, "r1"), full_state("r1"), "a run created twice")


async def _unknown_run(subject: StoreUnderTest) -> None:
    async with subject.make() as store:
        for what, act in (("open", store.open), ("read", store.read)):
            exc = await _refused(f"{what} of a run never created", RunNotFound, act("nope"))
            _names(exc, "nope", what)
        if await store.list_runs():
            raise _fail("opening an unknown run made a run: it must start nothing afresh")
        await _created(store, first_state("nope"))  # the ID was never used
        if await store.list_runs() != ["nope"]:
            raise _fail("a run created after a RunNotFound is not listed")


async def _one_owner(subject: StoreUnderTest) -> None:
    async with subject.make() as store, subject.make() as other:
        handle = await store.create(first_state("r1"))
        for where, opener in (("the same", store), ("another", other), ("the same", store)):
            exc = await _refused(
                f"opening an owned run through {where} store object", Locked, opener.open("r1")
            )
            _names(exc, "r1", "Locked")
        await handle.save(full_state("r1"))
        await handle.close()
        again, state = await other.open("r1")
        await _refused("opening a run owned through another store object", Locked, store.open("r1"))
        await again.close()
    _same(state, full_state("r1"), "the run opened once its owner closed it")


async def _read_unowned(subject: StoreUnderTest) -> None:
    async with subject.make() as store, subject.make() as other:
        handle = await store.create(first_state("r1"))
        await handle.save(full_state("r1"))
        _same(await other.read("r1"), full_state("r1"), "an owned run, read")
        await handle.save(first_state("r1"))  # reading took nothing from the owner
        await handle.close()
    _same(await _loaded(subject, "r1"), first_state("r1"), "the run saved after a read")


async def _listing(subject: StoreUnderTest) -> None:
    names = ["b-2", "a-1", "B-0", "a.9", "a_1", "0"]
    async with subject.make() as store:
        if await store.list_runs() != []:
            raise _fail("a new store lists runs already")
        owned = await store.create(first_state("held"))
        for run_id in names:
            await _created(store, first_state(run_id))
        listed = await store.list_runs()
        described = {run_id: store.describe(run_id) for run_id in names}
        await owned.close()
    if listed != sorted([*names, "held"]):
        raise _fail(f"list_runs gave {listed}, not every run's ID sorted (an owned run included)")
    if any(run_id not in where for run_id, where in described.items()):
        raise _fail(f"describe does not name the run: {described}")
    if len(set(described.values())) != len(names):
        raise _fail(f"describe gives two runs the same place: {described}")


async def _bad_ids(subject: StoreUnderTest) -> None:
    async with subject.make() as store:
        for bad in ("../escape", "a b", "", ".hidden", "x" * 129, "a/b", "é"):
            await _refused(f"create of run {bad!r}", InvalidRunId, store.create(first_state(bad)))
            await _refused(f"open of run {bad!r}", InvalidRunId, store.open(bad))
            await _refused(f"read of run {bad!r}", InvalidRunId, store.read(bad))
        await _created(store, first_state("x" * 128))
        if await store.list_runs() != ["x" * 128]:
            raise _fail("refused run IDs left runs behind, or the longest valid ID was not kept")


async def _corrupt(subject: StoreUnderTest) -> None:
    torn = subject.encode(full_state("r1"))
    garbage = {
        "empty": b"",
        "text": b"not json at all",
        "bad checksum": b'{"durably": 1, "crc32": 1, "state": {}}',
        "torn": torn[: len(torn) * 2 // 3],
        "one byte changed": torn.replace(b"triage", b"triagf", 1),
    }
    async with subject.make() as store:
        await _created(store, first_state("r1"))
    for name, data in garbage.items():
        _planted(subject, "r1", data)
        async with subject.make() as store:
            what = f"a run whose state is {name}"
            for act in (store.open, store.open, store.read):
                exc = await _refused(what, CheckpointCorrupt, act("r1"))
                if getattr(exc, "path", None) != store.describe("r1"):
                    raise _fail(f"CheckpointCorrupt for {what} names {exc}, not describe('r1')")
            await _refused(f"create over {what}", RunExists, store.create(first_state("r1")))
            if await store.list_runs() != ["r1"]:
                raise _fail(f"{what} is no longer listed")
        if _raw(subject, "r1") != data:
            raise _fail(f"{what} was changed: a damaged checkpoint must be left as it was")


async def _another_run(subject: StoreUnderTest) -> None:
    async with subject.make() as store:
        await _created(store, first_state("r1"))
    _planted(subject, "r1", subject.encode(first_state("r2")))
    async with subject.make() as store:
        exc = await _refused(
            "a run whose state names run 'r2'", CheckpointCorrupt, store.open("r1")
        )
        if "r2" not in str(exc):
            raise _fail(f"the error for a state of another run does not name it: {exc}")


async def _too_new(subject: StoreUnderTest) -> None:
    newer = first_state("r1")
    newer.format = FORMAT + 1
    async with subject.make() as store:
        await _created(store, first_state("r1"))
    _planted(subject, "r1", subject.encode(newer))
    async with subject.make() as store:
        for act in (store.open, store.read):
            exc = await _refused("a state of a newer format", CheckpointTooNew, act("r1"))
            if getattr(exc, "found", None) != FORMAT + 1:
                raise _fail(f"CheckpointTooNew does not give the format found: {exc}")
    if _raw(subject, "r1") != subject.encode(newer):
        raise _fail("a state of a newer format was changed: it must be kept for the newer durably")


async def _without_waiting(subject: StoreUnderTest) -> None:
    async with subject.make() as store, await store.create(first_state("r1")) as handle:
        save_now = getattr(handle, "save_without_waiting", None)
        if save_now is None:
            return  # optional: the loop then always awaits save
        if not isinstance(saved := save_now(full_state("r1")), bool):
            raise _fail(f"save_without_waiting gave {saved!r}, not True or False")
        if saved:
            _same(await store.read("r1"), full_state("r1"), "a state saved without waiting")
        await handle.save(first_state("r1"))
    _same(await _loaded(subject, "r1"), first_state("r1"), "the save after save_without_waiting")


async def _lifecycle(subject: StoreUnderTest) -> None:
    store = subject.make()
    async with store as entered:
        if entered is not store:
            raise _fail("async with store gives another object than the store")
        handle = await store.create(first_state("r1"))
    await handle.save(full_state("r1"))  # a handle outlives its store's close
    await handle.close()
    await store.close()  # closing twice is harmless
    _same(await store.read("r1"), full_state("r1"), "a closed store used again:")
    handle, _ = await store.open("r1")
    async with handle as same:
        if same is not handle:
            raise _fail("async with handle gives another object than the handle")
    await store.close()
    async with subject.make() as other:
        await (await other.open("r1"))[0].close()  # async with released the run


async def _model(subject: StoreUnderTest) -> None:
    """Random sequences of operations agree with a model: a dict of states, a set of owners."""
    ops = ("create", "open", "save", "close", "read")
    created: set[str] = set()
    async with subject.make() as store:
        for seed in range(12):
            draw = random.Random(seed)  # noqa: S311 -- reproducible sequences, not secrets
            saved: dict[str, RunState] = {}
            handles: dict[str, RunHandle] = {}
            for step in range(14):
                op, run_id = draw.choice(ops), f"s{seed}-{draw.choice('ab')}"
                state = first_state(run_id)
                state.phase, state.turns = draw.choice(list(Phase)), step
                what = f"sequence {seed}, step {step}: {op} {run_id}"
                await _step(store, op, state, saved, handles, what)
            for handle in handles.values():
                await handle.close()
            created |= set(saved)
        listed = await store.list_runs()
    if listed != sorted(created):
        raise _fail(f"after the sequences list_runs gave {listed}, not {sorted(created)}")


async def _step(  # noqa: PLR0917 - private step of the conformance machine, one caller
    store: Store,
    op: str,
    state: RunState,
    saved: dict[str, RunState],
    handles: dict[str, RunHandle],
    what: str,
) -> None:
    run_id = state.run_id
    if op == "create" and run_id in saved:
        await _refused(what, (RunExists, Locked), store.create(state))
    elif op == "create":
        handles[run_id] = await store.create(state)
        saved[run_id] = state
    elif op == "open" and run_id not in saved:
        await _refused(what, RunNotFound, store.open(run_id))
    elif op == "open" and run_id in handles:
        await _refused(what, Locked, store.open(run_id))
    elif op == "open":
        handles[run_id], loaded = await store.open(run_id)
        _same(loaded, saved[run_id], what)
    elif op == "save" and run_id in handles:
        await handles[run_id].save(state)
        saved[run_id] = state
    elif op == "close" and run_id in handles:
        await handles.pop(run_id).close()
    elif op == "read" and run_id in saved:
        _same(await store.read(run_id), saved[run_id], what)
    elif op == "read":
        await _refused(what, RunNotFound, store.read(run_id))


CHECKS: Sequence[Check] = (
    Check(
        "create-then-open", "a created run opens and reads as created, stamped", _create_then_open
    ),
    Check("every-field", "every field of the state survives a save and a reopen", _every_field),
    Check("newest-save-wins", "the last save is what the next open loads", _newest_save),
    Check(
        "no-second-create", "a used run ID is refused by create, open or closed", _no_second_create
    ),
    Check("unknown-run", "an unknown run is RunNotFound and nothing is created", _unknown_run),
    Check("one-owner", "a second opener is Locked at once until the owner closes", _one_owner),
    Check("read-unowned", "reading needs no ownership and takes none", _read_unowned),
    Check("listing", "list_runs is every run sorted; describe names each", _listing),
    Check("bad-run-ids", "a run ID outside the pattern is InvalidRunId, everywhere", _bad_ids),
    Check(
        "corrupt-kept",
        "a damaged state is CheckpointCorrupt, left as it was, never started afresh",
        _corrupt,
        reaches_under=True,
    ),
    Check("another-run", "a state naming another run is CheckpointCorrupt", _another_run, True),
    Check("too-new", "a state of a newer format is CheckpointTooNew, and kept", _too_new, True),
    Check("save-without-waiting", "save_without_waiting, when offered, saves", _without_waiting),
    Check("lifecycle", "async with, close twice, a handle outliving its store", _lifecycle),
    Check("model", "random operations agree with a dict of states and a set of owners", _model),
)
"""Every rule of the suite, in the order the module lists them."""
