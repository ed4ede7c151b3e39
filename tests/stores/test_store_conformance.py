"""The store conformance suite (``durably.testing.stores``) against every store durably ships,
and against stores broken on purpose, each of which it must catch.
"""

from __future__ import annotations

import asyncio
import secrets
import unittest
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Self, TypeVar

import msgspec
import pytest
from _store_backends import Backend, file_backend
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import durably
from _helpers.samples import state_a, without_saved_at
from durably.state import Phase, RunState
from durably.stores import RunHandle, Store
from durably.stores.file import FileStore
from durably.testing.stores import (
    CHECKS,
    Check,
    ConformanceError,
    StoreUnderTest,
    first_state,
    full_state,
)

T = TypeVar("T")

BY_NAME = {check.name: check for check in CHECKS}


def on(backend: Backend, scenario: Callable[[Store], Awaitable[T]]) -> T:
    """Run ``scenario`` against a fresh store object of ``backend`` in a new event loop."""

    async def main() -> T:
        async with backend.open() as store:
            return await scenario(store)

    return asyncio.run(main())


@pytest.mark.parametrize("check", CHECKS, ids=str)
def test_every_store_keeps_every_rule(every_store: Backend, check: Check) -> None:
    """Each run store durably ships (snapshot, journal, directory, Postgres) keeps each
    rule of the public suite.
    """
    check.run(every_store.subject())


def test_the_full_state_leaves_no_field_at_its_default() -> None:
    """The state the suite round-trips sets every field, so a store forgetting one is caught."""
    bare = msgspec.structs.asdict(
        RunState(run_id="r1", task="t", created_at=first_state("r1").created_at)
    )
    full = msgspec.structs.asdict(full_state("r1"))
    at_default = {
        name
        for name in bare
        if name not in ("run_id", "task", "created_at", "format", "saved_at")
        and full[name] == bare[name]
    }
    assert not at_default


# -- stores broken on purpose: the suite must fail each, at the rule it breaks ----------------


class _Handle:
    """A file store's handle, passed through the broken store's flaw."""

    def __init__(self, inner: RunHandle, flaw: str) -> None:
        self.inner = inner
        self.flaw = flaw

    @property
    def run_id(self) -> str:
        return self.inner.run_id

    async def save(self, state: RunState) -> None:
        if self.flaw == "forgets-a-field":
            state = msgspec.structs.replace(state, pending={})
        await self.inner.save(state)

    async def close(self) -> None:
        await self.inner.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class _Loose:
    """A second owner's handle, which a store that forgets its lock hands out."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    async def save(self, state: RunState) -> None:
        pass

    async def close(self) -> None:
        pass

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        pass


class _BrokenStore:
    """A ``FileStore`` with one rule broken on purpose (``flaw``)."""

    def __init__(self, directory: Path, flaw: str) -> None:
        self.inner = FileStore(directory)
        self.flaw = flaw

    async def create(self, state: RunState) -> RunHandle:
        return _Handle(await self.inner.create(state), self.flaw)

    async def open(self, run_id: str) -> tuple[RunHandle, RunState]:
        try:
            handle, state = await self.inner.open(run_id)
        except durably.Locked:
            if self.flaw != "two-owners":
                raise
            return _Loose(run_id), await self.read(run_id)
        except durably.CheckpointCorrupt:
            if self.flaw != "starts-afresh":
                raise
            (self.inner.directory / f"{run_id}.json").unlink()
            fresh = first_state(run_id)
            return _Handle(await self.inner.create(fresh), self.flaw), fresh
        return _Handle(handle, self.flaw), state

    async def read(self, run_id: str) -> RunState:
        return await self.inner.read(run_id)

    async def list_runs(self) -> list[str]:
        runs = await self.inner.list_runs()
        return runs[::-1] if self.flaw == "unsorted" else runs

    def describe(self, run_id: str) -> str:
        return self.inner.describe(run_id)

    async def close(self) -> None:
        await self.inner.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


BROKEN = {
    "forgets-a-field": "every-field",
    "two-owners": "one-owner",
    "starts-afresh": "corrupt-kept",
    "unsorted": "listing",
}
"""Each flaw, and the rule of the suite that must catch it."""


@pytest.mark.parametrize(("flaw", "rule"), BROKEN.items(), ids=list(BROKEN))
def test_the_suite_fails_a_store_that_breaks_a_rule(tmp_path: Path, flaw: str, rule: str) -> None:
    """A store with a flaw fails the rule it breaks, with a message naming store and rule,
    and still passes a rule it keeps (the failure is the flaw's, not the harness's).
    """
    backend = file_backend(tmp_path / "runs", lambda directory: _BrokenStore(directory, flaw))
    subject = StoreUnderTest(
        name=f"broken ({flaw})", make=backend.make, plant=backend.plant, raw=backend.raw
    )
    with pytest.raises(ConformanceError, match=rf"broken \({flaw}\) breaks {rule}: "):
        BY_NAME[rule].run(subject)
    fresh = file_backend(tmp_path / "fresh", lambda directory: _BrokenStore(directory, flaw))
    BY_NAME["create-then-open"].run(fresh.subject())


def test_a_store_without_hooks_skips_the_checks_that_reach_under_it(tmp_path: Path) -> None:
    """With no plant and raw the damage checks skip (unittest.SkipTest), and the rest run."""
    subject = StoreUnderTest(name="hookless", make=lambda: FileStore(tmp_path / "runs"))
    reaching = [check for check in CHECKS if check.reaches_under]
    assert {check.name for check in reaching} == {"corrupt-kept", "another-run", "too-new"}
    for check in reaching:
        with pytest.raises(unittest.SkipTest, match=check.name):
            check.run(subject)
    BY_NAME["newest-save-wins"].run(subject)


_ops = st.lists(
    st.tuples(
        st.sampled_from(["create", "open", "save", "close", "read"]),
        st.sampled_from(["r1", "r2"]),
        st.sampled_from(list(Phase)),
    ),
    max_size=12,
)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=_ops)
def test_the_store_behaves_like_a_dictionary_with_locks(
    every_store: Backend, ops: list[tuple[str, str, Phase]]
) -> None:
    """Any sequence of store operations agrees with a model: a dict of states, a set of owners."""
    prefix = f"h{secrets.token_hex(4)}-"

    async def scenario(store: Store) -> None:
        saved: dict[str, RunState] = {}
        handles: dict[str, RunHandle] = {}
        for op, name, phase in ops:
            run_id = prefix + name
            state = state_a(run_id)
            state.phase = phase
            state.turns = len(saved)
            if op == "create":
                if run_id in saved:
                    with pytest.raises((durably.RunExists, durably.Locked)):
                        await store.create(state)
                else:
                    handles[run_id] = await store.create(state)
                    saved[run_id] = state
            elif op == "open":
                if run_id not in saved:
                    with pytest.raises(durably.RunNotFound):
                        await store.open(run_id)
                elif run_id in handles:
                    with pytest.raises(durably.Locked):
                        await store.open(run_id)
                else:
                    handles[run_id], loaded = await store.open(run_id)
                    assert without_saved_at(loaded) == without_saved_at(saved[run_id])
            elif op == "save" and run_id in handles:
                await handles[run_id].save(state)
                saved[run_id] = state
            elif op == "close" and run_id in handles:
                await handles.pop(run_id).close()
            elif op == "read" and run_id in saved:
                assert without_saved_at(await store.read(run_id)) == without_saved_at(saved[run_id])
        for handle in handles.values():
            await handle.close()
        listed = [r for r in await store.list_runs() if r.startswith(prefix)]
        assert listed == sorted(saved)

    on(every_store, scenario)
