"""User code returning anything at all never leaves a checkpoint that cannot be loaded.

Hypothesis drives the loop with a model, tools, lookups, ``intends`` hooks and an
approver that hand back arbitrary values (ints, None, bytes, nested dicts, huge
strings, lone surrogates, objects JSON cannot hold, deeply nested lists). After
every save the loop makes, the run is read back through the store, as another
process would read it, in each store backend.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from _store_backends import Backend
from _store_fixtures import STORES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import durably
from durably import (
    DEFER,
    NOT_FOUND,
    UNKNOWN,
    Agent,
    Call,
    Done,
    Effect,
    Found,
    Limits,
    No,
    Reply,
    Rerun,
    ToolContext,
    Usage,
    Yes,
)
from durably.approval import ApprovalRequest, ResolveRequest
from durably.models import ModelRequest, Price
from durably.state import RunState, encode_state
from durably.stores import RunHandle, Store

EXAMPLES = {"file": 6, "journal": 6, "postgres": 4}
"""Generated cases per hostile hook, by backend (15 hooks: 240 cases in all)."""

_deep: list[Any] = []
_cursor = _deep
for _ in range(5_000):
    _cursor.append([])
    _cursor = _cursor[0]

lone_surrogates = st.builds(
    lambda before, code, after: before + chr(code) + after,
    st.text(max_size=5),
    st.integers(0xD800, 0xDFFF),
    st.text(max_size=5),
)
json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)
wild = st.one_of(
    lone_surrogates,
    st.text(max_size=30),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.none(),
    st.binary(max_size=20),
    json_like,
    st.dictionaries(st.none() | st.integers(), st.integers(), min_size=1, max_size=2),
    st.just("x" * 300_000),
    st.just(_deep),
    st.builds(object),
    st.floats(),
)
"""Anything user code might hand back."""


def bypassed(cls: type[Any], field: str, value: object, valid: str = "ok") -> Any:
    """An answer object whose text field was changed after its checks ran."""
    answer = cls(valid)
    object.__setattr__(answer, field, value)
    return answer


HOOKS = [
    "reply",
    "reply text",
    "call id",
    "call name",
    "call arguments",
    "usage",
    "echo result",
    "act result",
    "boom message",
    "in doubt message",
    "intends",
    "lookup",
    "approve",
    "resolve",
    "everything",
]
"""Where one example's user code turns hostile; everywhere else it behaves, so the run gets
far enough to meet that hook (Hypothesis would otherwise end most runs at the first reply)."""

SCRIPT = [["echo", "act", "boom"], ["act", "echo"], ["echo"]]
"""The well-behaved model's calls per turn; then it answers."""


class Wild:
    """Every piece of user code in one place; the example's hostile hook answers with anything."""

    def __init__(self, data: st.DataObject, target: str) -> None:
        self.draw = data.draw
        self.target = target

    def pick(self, hook: str, good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> Any:
        """A value for ``hook``: hostile when it is the example's target."""
        hostile = self.target == hook or (
            self.target == "everything" and self.draw(st.booleans(), label=f"{hook} hostile")
        )
        return self.draw(bad if hostile else good, label=hook)

    # -- the model --------------------------------------------------------------------

    name = "wild"
    max_output_tokens = 100

    def dollars(self, usage: Usage) -> float:
        """Dollars at a fixed price (the property varies what the model says, not what it costs)."""
        return Price(input=3.0, output=15.0).dollars(usage)

    async def reply(self, request: ModelRequest) -> Any:
        """The scripted reply of this turn, or a hostile value when the reply is the target."""
        if request.turn > len(SCRIPT):
            return Reply(text=self.pick("reply text", st.text(max_size=20), wild))
        junk = self.pick("reply", st.none(), wild)
        if junk is not None:
            return junk
        calls = [
            Call(
                self.pick("call id", st.just(f"t{request.turn}c{n}"), wild),
                self.pick("call name", st.just(name), wild),
                self.pick(
                    "call arguments",
                    st.sampled_from(['{"x": 1}', "{}"]),
                    st.just("{not json") | st.just('{"x": "a"}') | wild,
                ),
            )
            for n, name in enumerate(SCRIPT[request.turn - 1])
        ]
        usage = self.pick(
            "usage",
            st.builds(Usage, input_tokens=st.integers(0, 500), output_tokens=st.integers(0, 100)),
            st.builds(Usage, input_tokens=wild)
            | st.builds(Usage, output_tokens=st.integers(-9, -1)),
        )
        text = self.pick("reply text", st.none() | st.text(max_size=20), wild)
        return Reply(text=text, calls=calls, usage=usage)

    # -- tools and their hooks -----------------------------------------------------------

    def tools(self) -> list[durably.Tool]:
        """The run's tools, whose results, lookups and errors may be hostile."""
        pick = self.pick
        doubt = self.target in ("lookup", "resolve", "in doubt message", "everything")
        sure = [NOT_FOUND, Found("it happened")]
        lookups = [UNKNOWN] if self.target == "resolve" else [*sure, UNKNOWN]

        async def intends(ctx: ToolContext, x: int = 0) -> Any:
            files = pick(
                "intends",
                st.just({"notes/a.txt": "A"}),
                st.dictionaries(wild, wild, min_size=1, max_size=2) | wild | st.just("raise"),
            )
            if files == "raise":
                raise RuntimeError(self.draw(lone_surrogates))
            return files

        async def lookup(ctx: ToolContext, x: int = 0) -> Any:
            answer = pick(
                "lookup",
                st.sampled_from(lookups),
                st.builds(bypassed, st.just(Found), st.just("result"), wild)
                | wild
                | st.just("raise"),
            )
            if answer == "raise":
                raise ConnectionError(self.draw(lone_surrogates))
            return answer

        @durably.tool(effect=Effect.READ)
        async def echo(ctx: ToolContext, x: int = 0) -> Any:
            """Return anything."""
            return pick("echo result", st.text(max_size=20), wild)

        @durably.tool(effect=Effect.WRITE, needs_approval=True, intends=intends, lookup=lookup)
        async def act(ctx: ToolContext, x: int = 0) -> Any:
            """Act, or lose track of whether it acted."""
            if doubt and (self.target != "everything" or self.draw(st.booleans())):
                message = pick("in doubt message", st.just("timed out"), wild)
                raise durably.ToolInDoubt(message)
            return pick("act result", st.just("acted"), wild)

        @durably.tool(effect=Effect.READ)
        async def boom(ctx: ToolContext, x: int = 0) -> str:
            """Raise with any message."""
            raise ValueError(pick("boom message", st.just("plain"), wild))

        return [echo, act, boom]

    # -- the approver ---------------------------------------------------------------------

    async def approve(self, request: ApprovalRequest) -> Any:
        """Yes or no, or a hostile answer when approval is the target."""
        answer = self.pick(
            "approve",
            st.sampled_from([Yes(), Yes(), No("not now")]),
            st.sampled_from([DEFER, "unavailable"])
            | st.builds(bypassed, st.just(No), st.just("reason"), wild)
            | wild,
        )
        if answer == "unavailable":
            raise durably.ApprovalUnavailable(
                run_id=request.run_id, call_id=request.call_id, reason="nobody"
            )
        return answer

    async def resolve(self, request: ResolveRequest) -> Any:
        """Rerun or done, or a hostile answer when resolving is the target."""
        return self.pick(
            "resolve",
            st.sampled_from([Rerun(), Done("a person saw it")]),
            st.builds(bypassed, st.just(Done), st.just("result"), wild) | wild | st.just(DEFER),
        )

    def observe(self, event: durably.Event) -> None:
        """Watch the run's events; the observer itself may raise."""
        if self.target == "everything" and self.draw(st.booleans(), label="observer raises"):
            raise RuntimeError("the display broke")


class CheckedHandle:
    """A run handle that reads the run back through the store after every save."""

    def __init__(self, handle: RunHandle, store: Store, saves: list[RunState]) -> None:
        self._handle, self._store, self._saves = handle, store, saves

    @property
    def run_id(self) -> str:
        """The run's ID."""
        return self._handle.run_id

    async def save(self, state: RunState) -> None:
        """Save, then read the run back and compare."""
        await self._handle.save(state)
        await self.check_saved(state)

    async def check_saved(self, state: RunState) -> None:
        """Read the run back: it loads, equals what was saved, and is kept."""
        loaded = await self._store.read(state.run_id)  # raises if it does not load
        assert loaded == state  # equal values (the encoding may omit a default it kept)
        self._saves.append(loaded)

    async def close(self) -> None:
        """Close the inner handle."""
        await self._handle.close()

    async def __aenter__(self) -> CheckedHandle:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class CheckedStore:
    """A store whose handles check every save by reading it back."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.saves: list[RunState] = []

    async def create(self, state: RunState) -> CheckedHandle:
        """Create the run and read it back at once."""
        handle = CheckedHandle(await self._store.create(state), self._store, self.saves)
        await handle.check_saved(state)
        return handle

    async def open(self, run_id: str) -> tuple[CheckedHandle, RunState]:
        """Open the run; its saves are checked."""
        handle, state = await self._store.open(run_id)
        return CheckedHandle(handle, self._store, self.saves), state

    async def read(self, run_id: str) -> RunState:
        """Read the run from the inner store."""
        return await self._store.read(run_id)

    async def list_runs(self) -> list[str]:
        """The inner store's runs."""
        return await self._store.list_runs()

    def describe(self, run_id: str) -> str:
        """The inner store's description of the run."""
        return self._store.describe(run_id)

    async def close(self) -> None:
        """Close the inner store."""
        await self._store.close()

    async def __aenter__(self) -> CheckedStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def drive(backend: Backend, data: st.DataObject, target: str) -> None:
    """One run with wild user code; every save is read back; only durably's errors escape."""
    user = Wild(data, target)

    async def scenario() -> None:
        async with backend.open() as store:
            checked = CheckedStore(store)
            agent = Agent(
                model=user,
                tools=user.tools(),
                store=checked,
                approver=user,
                limits=Limits(max_turns=6, max_dollars=1.0),
                observer=user.observe,
            )
            try:
                outcome = await agent.run("do anything")
            except durably.DurablyError:
                pass  # a clear refusal; the run saved so far must still load (checked below)
            else:
                assert outcome.status in ("done", "paused")
            assert checked.saves, "the run saved nothing"
            (run_id,) = {s.run_id for s in checked.saves}
            final = await store.read(run_id)
            assert final == checked.saves[-1]
            json.loads(encode_state(final))  # plain JSON, readable by anything

    asyncio.run(scenario())


def _settings(backend: str) -> settings:
    return settings(
        max_examples=EXAMPLES[backend],
        deadline=None,
        derandomize=True,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "any_store",
    ["file", "journal", pytest.param("postgres", marks=pytest.mark.postgres)],
    indirect=True,
)
def test_every_state_saved_with_wild_user_code_loads_again(
    any_store: Backend, request: pytest.FixtureRequest
) -> None:
    """Whatever a model, tool, lookup, intends hook or approver returns, every state the loop
    saves loads again from the store, and nothing but a durably error escapes the run.
    """
    backend = request.node.callspec.params["any_store"]
    cases: list[str] = []
    for target in HOOKS:
        hostile(any_store, backend, target, cases)()
    planned = EXAMPLES[backend] * len(HOOKS)
    print(f"{backend}: {len(cases)} generated cases ({planned} planned)")
    # Hypothesis stops early only when a hook's space is exhausted; most must run in full.
    assert len(cases) >= planned * 3 // 4
    assert set(cases) == set(HOOKS)


def hostile(any_store: Backend, backend: str, target: str, cases: list[str]) -> Any:
    """The property for one hostile hook, as a Hypothesis test; each case is noted in ``cases``."""

    @_settings(backend)
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        cases.append(target)
        drive(any_store, data, target)

    return check


def test_examples_cover_every_backend() -> None:
    """The property runs against every store backend of the conformance suite."""
    assert set(EXAMPLES) == set(STORES)
