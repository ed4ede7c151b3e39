"""The store conformance suite: every backend in ``conftest.STORES`` keeps these rules."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from _store_backends import Backend
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import durably
from _helpers.samples import sized_state, state_a, state_b, without_saved_at
from durably.checkpoint.envelope import seal
from durably.state import FORMAT, Phase, RunState
from durably.stores import RunHandle, Store

T = TypeVar("T")


def on(backend: Backend, scenario: Callable[[Store], Awaitable[T]]) -> T:
    """Run ``scenario`` against a fresh store object of ``backend`` in a new event loop."""

    async def main() -> T:
        async with backend.open() as store:
            return await scenario(store)

    return asyncio.run(main())


def test_a_created_run_opens_and_reads_as_it_was_created(any_store: Backend) -> None:
    """A created run opens, and reads, with exactly the state it was created with."""

    async def scenario(store: Store) -> tuple[RunState, RunState]:
        assert isinstance(store, Store)
        handle = await store.create(state_a("r1"))
        assert isinstance(handle, RunHandle)
        assert handle.run_id == "r1"
        await handle.close()
        handle, opened = await store.open("r1")
        await handle.close()
        return opened, await store.read("r1")

    opened, read = on(any_store, scenario)
    assert without_saved_at(opened) == state_a("r1")
    assert without_saved_at(read) == state_a("r1")
    assert opened.saved_at is not None


def test_a_saved_state_round_trips_through_close_and_reopen(any_store: Backend) -> None:
    """The newest save is what the next open loads, field for field, from another store object."""

    async def first(store: Store) -> None:
        async with await store.create(state_a("r1")) as handle:
            await handle.save(state_b("r1"))
            await handle.save(sized_state("r1", 50_000))
            await handle.save(state_b("r1"))

    async def second(store: Store) -> RunState:
        handle, state = await store.open("r1")
        await handle.close()
        return state

    on(any_store, first)
    assert without_saved_at(on(any_store, second)) == state_b("r1")


def test_a_used_run_id_cannot_be_created_again(any_store: Backend) -> None:
    """Creating a run whose ID exists is refused, while open and after close; the run is kept."""

    async def scenario(store: Store) -> RunState:
        handle = await store.create(state_a("r1"))
        await handle.save(state_b("r1"))
        # While the run is open the file store meets its lock first: Locked is as good
        # a refusal as RunExists there. Once closed, only RunExists is right.
        with pytest.raises((durably.RunExists, durably.Locked)) as caught:
            await store.create(state_a("r1"))
        assert isinstance(caught.value, (durably.RunExists, durably.Locked))
        assert caught.value.run_id == "r1"
        await handle.close()
        with pytest.raises(durably.RunExists):
            await store.create(state_a("r1"))
        return await store.read("r1")

    assert without_saved_at(on(any_store, scenario)) == state_b("r1")


def test_an_unknown_run_is_run_not_found(any_store: Backend) -> None:
    """Opening or reading a run that was never created is RunNotFound naming the run."""

    async def scenario(store: Store) -> None:
        with pytest.raises(durably.RunNotFound) as opened:
            await store.open("nope")
        with pytest.raises(durably.RunNotFound) as read:
            await store.read("nope")
        assert opened.value.run_id == read.value.run_id == "nope"

    on(any_store, scenario)


def test_a_second_opener_is_locked_until_the_first_closes(any_store: Backend) -> None:
    """While a run is open a second open is Locked at once; after close it opens again."""

    async def scenario(store: Store) -> RunState:
        handle = await store.create(state_a("r1"))
        for _ in range(2):
            with pytest.raises(durably.Locked) as caught:
                await store.open("r1")
            assert caught.value.run_id == "r1"
        await handle.save(state_b("r1"))
        await handle.close()
        again, state = await store.open("r1")
        await again.close()
        return state

    assert without_saved_at(on(any_store, scenario)) == state_b("r1")


def test_read_needs_no_ownership(any_store: Backend) -> None:
    """A run owned by a handle can still be read, and reading takes nothing from the owner."""

    async def scenario(store: Store) -> None:
        handle = await store.create(state_a("r1"))
        await handle.save(state_b("r1"))
        assert without_saved_at(await store.read("r1")) == state_b("r1")
        await handle.save(state_a("r1"))
        await handle.close()

    on(any_store, scenario)


def test_list_runs_is_sorted_and_describe_names_the_run(any_store: Backend) -> None:
    """list_runs gives every run's ID sorted, and describe names where each run lives."""

    async def scenario(store: Store) -> list[str]:
        assert await store.list_runs() == []
        for run_id in ("b-2", "a-1", "B-0", "a.9"):
            await (await store.create(state_a(run_id))).close()
        assert "a-1" in store.describe("a-1")
        assert store.describe("a-1") != store.describe("b-2")
        return await store.list_runs()

    assert on(any_store, scenario) == sorted(["b-2", "a-1", "B-0", "a.9"])


def test_a_bad_run_id_is_refused(any_store: Backend) -> None:
    """A run ID outside the allowed pattern is InvalidRunId for create, open and read."""

    async def scenario(store: Store) -> None:
        with pytest.raises(durably.InvalidRunId):
            await store.create(state_a("../escape"))
        with pytest.raises(durably.InvalidRunId):
            await store.open("a b")
        with pytest.raises(durably.InvalidRunId):
            await store.read("")
        assert await store.list_runs() == []

    on(any_store, scenario)


@pytest.mark.parametrize(
    "garbage",
    [b"", b"not json at all", b'{"durably": 1, "crc32": 1, "state": {}}', seal(state_b("r1"))[:-9]],
    ids=["empty", "text", "bad-checksum", "torn"],
)
def test_a_corrupt_state_is_checkpoint_corrupt_and_left_untouched(
    any_store: Backend, garbage: bytes
) -> None:
    """Garbage in place of a run's state is CheckpointCorrupt naming the run, and stays as is."""

    async def create(store: Store) -> None:
        await (await store.create(state_a("r1"))).close()

    async def scenario(store: Store) -> None:
        for _ in range(2):
            with pytest.raises(durably.CheckpointCorrupt) as opened:
                await store.open("r1")
            assert opened.value.path == store.describe("r1")
        with pytest.raises(durably.CheckpointCorrupt):
            await store.read("r1")
        with pytest.raises(durably.RunExists):
            await store.create(state_a("r1"))

    on(any_store, create)
    any_store.plant("r1", garbage)
    on(any_store, scenario)
    assert any_store.raw("r1") == garbage


def test_a_state_of_another_run_is_corrupt(any_store: Backend) -> None:
    """A stored state that names another run is CheckpointCorrupt, not that run's state."""

    async def create(store: Store) -> None:
        await (await store.create(state_a("r1"))).close()

    async def scenario(store: Store) -> None:
        with pytest.raises(durably.CheckpointCorrupt, match="holds run 'r2'"):
            await store.open("r1")

    on(any_store, create)
    any_store.plant("r1", seal(state_a("r2")))
    on(any_store, scenario)


def test_a_state_of_a_newer_format_is_checkpoint_too_new(any_store: Backend) -> None:
    """A state written by a newer durably is CheckpointTooNew on open and read, and kept."""
    newer = state_a("r1")
    newer.format = FORMAT + 1

    async def create(store: Store) -> None:
        await (await store.create(state_a("r1"))).close()

    async def scenario(store: Store) -> None:
        with pytest.raises(durably.CheckpointTooNew) as caught:
            await store.open("r1")
        assert caught.value.found == FORMAT + 1
        assert caught.value.path == store.describe("r1")
        with pytest.raises(durably.CheckpointTooNew):
            await store.read("r1")

    on(any_store, create)
    any_store.plant("r1", seal(newer))
    on(any_store, scenario)
    assert any_store.raw("r1") == seal(newer)


_ops = st.lists(
    st.tuples(
        st.sampled_from(["create", "open", "save", "close", "read"]),
        st.sampled_from(["r1", "r2"]),
        st.sampled_from(list(Phase)),
    ),
    max_size=12,
)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=_ops)
def test_the_store_behaves_like_a_dictionary_with_locks(
    any_store: Backend, ops: list[tuple[str, str, Phase]]
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

    on(any_store, scenario)
