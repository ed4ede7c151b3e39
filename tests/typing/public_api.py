"""The public API as a user's type checker sees it: checked by mypy (strict), never run.

Each ``assert_type`` states a type a user relies on; each ``type: ignore[code]``
states a misuse the checker must refuse (strict mypy reports an ignore that
is not needed, so a refusal that stops happening fails the check).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Literal, assert_type

import durably
from durably import postgres
from durably.postgres.store import PostgresStore
from durably.state import ApprovalKind, ResolutionOutcome, RunState
from durably.stores import RunHandle
from durably.transports import HttpToolError, McpToolError


async def postgres_store_is_a_class() -> None:
    """``durably.PostgresStore`` (loaded lazily at run time) is the store class to mypy."""
    store = durably.PostgresStore("postgresql:///runs", lease=timedelta(seconds=30))
    assert_type(store, PostgresStore)
    _handle, state = await store.open("run-1")
    assert_type(state, RunState)
    durably.PostgresStore(lease=30)  # type: ignore[arg-type]


async def the_postgres_package_is_typed(store: postgres.PostgresStore) -> None:
    """``durably.postgres`` and ``durably.postgres.store`` name the same store; the work
    queue's functions are typed.
    """
    same: PostgresStore = store
    assert_type(same, postgres.PostgresStore)
    claims = await postgres.claim(store, agents=["refunds"], limit=4)
    assert_type(claims, list[postgres.Claim])
    assert_type(claims[0].handle, postgres.PostgresRun)
    assert_type(await postgres.park(claims[0].handle, "why"), bool)
    await postgres.enqueue(store, run_id="r1", agent="refunds")  # type: ignore[call-arg]


async def an_agent_drives_a_handle_it_is_given(
    agent: durably.Agent, handle: RunHandle, state: RunState
) -> None:
    """The loop runs on a handle its caller holds: a new run's or a resumed one's."""
    assert_type(await agent.start(handle, "refund order 1042"), durably.Outcome)
    assert_type(await agent.drive(handle, state), durably.Outcome)
    await agent.drive(handle, "run-1")  # type: ignore[arg-type]


def errors_keep_typed_fields(error: durably.DurablyError) -> None:
    """Fields of an error are typed attributes, and its constructor takes keywords only."""
    if isinstance(error, durably.RunNotFound):
        assert_type(error.run_id, str)
        assert_type(error.where, str)
    if isinstance(error, durably.LimitExceeded):
        assert_type(error.limit, float)
    if isinstance(error, HttpToolError):
        assert_type(error.status, int | None)
    durably.RunNotFound("run-1", "here")  # type: ignore[call-arg]


def transport_errors_are_durably_errors() -> None:
    """A remote tool's error is caught by ``except durably.DurablyError``."""
    error: durably.DurablyError = HttpToolError("503", status=503)
    other: durably.DurablyError = McpToolError("refused")
    base: durably.StorageError = durably.StoreUnavailable(where="db", reason="down")
    assert_type(error, durably.DurablyError)
    assert_type(other, durably.DurablyError)
    assert_type(base, durably.StorageError)


def closed_sets_are_enums(state: RunState) -> None:
    """Saved questions and resolutions carry enums, not free strings."""
    for question in state.pending.values():
        assert_type(question.kind, ApprovalKind)
    for resolution in state.resolutions.values():
        assert_type(resolution.outcome, ResolutionOutcome)
    state.resolutions["c1"] = durably.state.Resolution(step=1, outcome="rerun")  # type: ignore[arg-type]


def agent_takes_keywords(model: durably.Model, store: durably.FileStore) -> durably.Agent:
    """An agent is built from keywords; a store is any ``Store``."""
    agent = durably.Agent(model=model, tools=[], store=store, limits=durably.Limits())
    durably.Agent(model, [], store)  # type: ignore[call-arg]
    return agent


def version_is_a_string() -> None:
    """``durably.__version__`` is a ``str``."""
    assert_type(durably.__version__, str)


def a_misspelt_name_is_refused() -> None:
    """A name ``durably`` does not export is an error, not an ``object`` (no module ``__getattr__``
    is visible to type checkers).
    """
    durably.FileStor  # type: ignore[attr-defined]  # noqa: B018
    durably.Store  # type: ignore[attr-defined]  # noqa: B018


async def an_agent_run_ends_in_a_typed_outcome(agent: durably.Agent) -> None:
    """``run``, ``resume`` and their sync twins return an ``Outcome`` with typed fields."""
    outcome = await agent.run("refund order 1042", run_id="r-1")
    assert_type(outcome, durably.Outcome)
    assert_type(outcome.status, Literal["done", "paused", "cancelled"])
    assert_type(outcome.answer, str | None)
    assert_type(outcome.dollars, float)
    assert_type(outcome.state, RunState)
    assert_type(await agent.resume("r-1"), durably.Outcome)
    assert_type(agent.run_sync("task"), durably.Outcome)
    assert_type(agent.resume_sync("r-1"), durably.Outcome)
    await agent.run("task", "name")  # type: ignore[call-arg]
    await agent.resume("r-1", None)  # type: ignore[call-arg]


async def find_refund(ctx: durably.ToolContext, order_id: str) -> durably.Lookup:
    """A lookup: what the service did under this call's key."""
    assert_type(ctx.idempotency_key, str)
    return durably.Found("refund 7") if order_id else durably.NOT_FOUND


def a_tool_needs_its_effect() -> durably.Tool:
    """``@durably.tool`` makes a ``Tool``; its effect has no default, so it must be given."""

    @durably.tool(
        effect=durably.Effect.KEYED,
        key_ttl=timedelta(hours=23),
        needs_approval=True,
        lookup=find_refund,
    )
    async def refund(ctx: durably.ToolContext, order_id: str) -> str:
        """Refund an order."""
        return ctx.idempotency_key + order_id

    assert_type(refund, durably.Tool)
    durably.tool()  # type: ignore[call-overload]
    durably.tool(effect="write")  # type: ignore[call-overload]
    return refund


async def no_ctx(order_id: str) -> str:
    """A tool function that forgot its context parameter."""
    return order_id


def not_a_tool(order_id: str) -> str:
    """A plain function, never declared with ``@durably.tool``."""
    return order_id


def declaration_mistakes_are_type_errors(model: durably.Model) -> None:
    """What issue 32's declaration checks refuse at run time, the type checker refuses first:
    a keyed tool without ``key_ttl`` (a ``key_ttl`` on another effect is refused at run
    time only), a function with
    no context parameter, a plain function as a tool, a model given by name, a limit of the
    wrong type. An effect chosen at run time passes ``key_ttl`` explicitly.
    """
    durably.tool(effect=durably.Effect.KEYED)  # type: ignore[call-overload]
    durably.tool(effect=durably.Effect.KEYED, key_ttl=durably.NEVER_EXPIRES)
    durably.tool(effect=durably.Effect.READ)(no_ctx)  # type: ignore[arg-type]
    durably.Agent(model=model, tools=[not_a_tool])  # type: ignore[list-item]
    durably.Agent(model="anthropic", tools=[])  # type: ignore[arg-type]
    durably.Limits(max_dollars="2")  # type: ignore[arg-type]
    chosen = durably.Effect.KEYED if model.name else durably.Effect.WRITE
    durably.tool(
        effect=chosen, key_ttl=None if chosen is not durably.Effect.KEYED else timedelta(1)
    )
    approver: durably.Approver = durably.decisions.AskLater()
    assert_type(durably.AskLater(), durably.decisions.AskLater)
    assert_type(durably.NOT_FOUND, durably.tools.NotFound)
    del approver


def the_seams_take_durablys_own_classes(directory: Path) -> None:
    """The shipped stores are ``Store``s, the scripted model a ``Model``, the approvers
    ``Approver``s; each builds from keywords after its first argument.
    """
    stores: list[durably.stores.Store] = [
        durably.FileStore(directory),
        durably.JournalStore(directory),
        durably.PostgresStore("postgresql:///runs"),
    ]
    model: durably.Model = durably.ScriptedModel([durably.Reply(text="done")], name="m")
    approvers: list[durably.Approver] = [
        durably.PolicyApprover(),
        durably.ScriptedApprover(),
        durably.TerminalApprover(),
    ]
    durably.ScriptedModel([], "m")  # type: ignore[call-arg]
    assert_type(durably.idempotency_key("r-1", "c-1"), str)
    assert_type(durably.new_run_id("task"), str)
    del stores, model, approvers
