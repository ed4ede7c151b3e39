"""``DurableTools``: a LangGraph tool call happens once, however often LangGraph re-runs its node.

A ``ToolNode`` graph on ``DurablySaver`` whose tools step is cut short (a
``BaseException`` that nothing catches, as a crash leaves it: the step's writes
unsaved, the marker of the call in flight saved) is resumed with ``invoke(None)``:
the call that had finished gets its saved result without running again; the call
in flight climbs the ladder and, with no lookup, is asked of a person through
``interrupt()``, answered with ``durably answer`` or ``Command(resume=...)``.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command

import durably
from durably.cli import main
from durably.langgraph import DurableTools, DurablySaver, tool_context
from durably.stores.file import FileStore

THREAD: Any = {"configurable": {"thread_id": "t"}}


class Crash(BaseException):
    """Stands for the process dying inside a tool: nothing catches it."""


class World:
    """A charging tool and a note tool, counted in files; a switch that crashes the note."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.charges = root / "charges"
        self.notes = root / "notes"
        self.crash = root / "crash-note"
        self.keys: list[str] = []

    def tools(self) -> list[Any]:
        """``charge`` (keyed, sends its key) and ``note`` (a write with no lookup)."""
        world = self

        @tool
        def charge(cents: int) -> str:
            """Charge the card."""
            key = tool_context().idempotency_key
            world.keys.append(key)
            with world.charges.open("a") as out:
                out.write(f"{cents} {key}\n")
            return f"charged {cents}"

        @tool
        def note(text: str) -> str:
            """Post a note."""
            with world.notes.open("a") as out:
                out.write(text + "\n")
            if world.crash.exists():
                world.crash.unlink()
                raise Crash
            return "noted"

        charge.metadata = {"effect": "keyed", "key_ttl": 3600}
        note.metadata = {"effect": "write"}
        return [charge, note]

    def count(self, path: Path) -> int:
        """Lines in one of the effect files."""
        return len(path.read_text().splitlines()) if path.exists() else 0


def agent(state: MessagesState) -> dict[str, list[Any]]:
    """Turn 1 calls both tools in one reply; turn 2 answers."""
    if any(isinstance(m, ToolMessage) for m in state["messages"]):
        return {"messages": [AIMessage(content="all done", id="reply-2")]}
    calls = [
        {"name": "charge", "args": {"cents": 500}, "id": "call-0"},
        {"name": "note", "args": {"text": "charged 500"}, "id": "call-1"},
    ]
    return {"messages": [AIMessage(content="", id="reply-1", tool_calls=calls)]}


def build(world: World, saver: DurablySaver, tools: DurableTools) -> Any:
    """The graph: a model node and a ``ToolNode`` wrapped by ``tools``."""
    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    node = ToolNode(
        world.tools(), wrap_tool_call=tools.wrap_tool_call, awrap_tool_call=tools.awrap_tool_call
    )
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)


def crashed_world(tmp_path: Path) -> tuple[World, FileStore]:
    """A thread whose tools step died inside ``note``, after ``charge`` returned."""
    world = World(tmp_path)
    world.crash.touch()
    store = FileStore(tmp_path / "runs", sync=False)
    with DurablySaver(tmp_path / "threads") as saver:
        graph = build(world, saver, DurableTools(store))
        with pytest.raises(Crash):
            graph.invoke({"messages": [HumanMessage("charge me", id="q")]}, THREAD)
    assert (world.count(world.charges), world.count(world.notes)) == (1, 1)
    return world, store


def test_a_finished_call_is_not_run_again_and_the_one_in_flight_asks_a_person(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """LangGraph re-runs the step: charge gets its saved result, note (marked, no result, no
    lookup) is asked of a person through interrupt(), listed by durably pending and settled by
    durably answer; nothing runs twice.
    """
    world, store = crashed_world(tmp_path)
    tools = DurableTools(store)
    with DurablySaver(tmp_path / "threads") as saver:
        graph = build(world, saver, tools)
        paused = graph.invoke(None, THREAD)
        (question,) = paused["__interrupt__"]
        assert question.value["durably"] == "resolve"
        assert question.value["call_id"] == "reply-1.call-1"
        assert world.count(world.charges) == 1, "the finished charge ran again"
        assert world.count(world.notes) == 1, "the note in doubt ran again"

        with pytest.raises(SystemExit) as listed:
            main(["pending", str(tmp_path / "runs"), "--json"])
        assert listed.value.code == 0
        pending = json.loads(capsys.readouterr().out)
        assert [(q["run"], q["call"], q["tool"]) for q in pending] == [
            ("t", "reply-1.call-1", "note")
        ]
        runs = str(tmp_path / "runs")
        with pytest.raises(SystemExit) as answered:
            main(["answer", "t", "reply-1.call-1", "done", "--result", "noted (seen)", runs])
        assert answered.value.code == 0

        final = graph.invoke(None, THREAD)
    assert final["messages"][-1].content == "all done"
    results = {m.tool_call_id: m.content for m in final["messages"] if isinstance(m, ToolMessage)}
    assert results == {"call-0": "charged 500", "call-1": "noted (seen)"}
    assert (world.count(world.charges), world.count(world.notes)) == (1, 1)


def test_a_person_answers_through_command_resume_and_rerun_runs_the_call_once_more(
    tmp_path: Path,
) -> None:
    """Command(resume="rerun") settles the in-doubt note from the graph's side: it runs once
    more (the person said it did not happen) and the charge still not at all.
    """
    world, store = crashed_world(tmp_path)
    with DurablySaver(tmp_path / "threads") as saver:
        graph = build(world, saver, DurableTools(store))
        assert "__interrupt__" in graph.invoke(None, THREAD)
        final = graph.invoke(Command(resume="rerun"), THREAD)
    assert final["messages"][-1].content == "all done"
    assert (world.count(world.charges), world.count(world.notes)) == (1, 2)
    state = store.read_sync("t")
    assert state.resolutions["reply-1.call-1"].outcome == "rerun"


def test_the_key_is_unique_per_call_even_when_a_model_reuses_a_tool_call_id(
    tmp_path: Path,
) -> None:
    """Two turns whose calls share the tool-call ID get different keys, each the documented
    ``idempotency_key(thread, "<message id>.<tool call id>")``; a re-run gets the same one.
    """
    world = World(tmp_path)
    store = FileStore(tmp_path / "runs", sync=False)
    tools = DurableTools(store)
    node = ToolNode(world.tools(), wrap_tool_call=tools.wrap_tool_call)

    def turn(state: MessagesState) -> dict[str, list[Any]]:
        replies = sum(isinstance(m, AIMessage) for m in state["messages"])
        if replies == 2:
            return {"messages": [AIMessage(content="twice", id="reply-3")]}
        call = {"name": "charge", "args": {"cents": 1}, "id": "call-0"}  # the same ID each turn
        return {"messages": [AIMessage(content="", id=f"reply-{replies + 1}", tool_calls=[call])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", turn)
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    with DurablySaver(tmp_path / "threads") as saver:
        builder.compile(checkpointer=saver).invoke(
            {"messages": [HumanMessage("go", id="q")]}, THREAD
        )
    assert world.keys == [
        durably.idempotency_key("t", "reply-1.call-0"),
        durably.idempotency_key("t", "reply-2.call-0"),
    ]
    assert world.count(world.charges) == 2


def test_create_react_agent_takes_the_wrapped_tool_node_and_a_tool_without_an_effect_is_refused(
    tmp_path: Path,
) -> None:
    """langgraph.prebuilt's create_react_agent runs its calls through a wrapped ToolNode; a tool
    that declares no effect is refused before it runs, with the remedy named.
    """
    from langgraph.prebuilt import create_react_agent

    world = World(tmp_path)
    store = FileStore(tmp_path / "runs", sync=False)
    tools = DurableTools(store)
    charge, note = world.tools()
    note.metadata = None

    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel

    class Scripted(FakeMessagesListChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    replies: list[BaseMessage] = [
        AIMessage(
            content="", id="r1", tool_calls=[{"name": "charge", "args": {"cents": 7}, "id": "c"}]
        ),
        AIMessage(
            content="", id="r2", tool_calls=[{"name": "note", "args": {"text": "x"}, "id": "d"}]
        ),
        AIMessage(content="done", id="r3"),
    ]
    node = ToolNode([charge, note], wrap_tool_call=tools.wrap_tool_call, handle_tool_errors=False)
    with DurablySaver(tmp_path / "threads") as saver, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # create_react_agent moved to langchain
        graph = create_react_agent(Scripted(responses=replies), node, checkpointer=saver)
        with pytest.raises(ValueError, match="tool 'note' declares no effect: give it metadata"):
            graph.invoke({"messages": [HumanMessage("go", id="q")]}, THREAD)
    assert world.count(world.charges) == 1
    assert world.count(world.notes) == 0, "a tool with no effect ran"
    assert store.read_sync("t").messages[-1].content == "charged 7"  # type: ignore[union-attr]


def test_a_custom_nodes_effect_wrapped_by_effect_is_not_repeated_when_the_node_runs_again(
    tmp_path: Path,
) -> None:
    """A node that charges through ``DurableTools.effect`` and dies before it returns is run
    again by LangGraph: the charge's saved result comes back and the card is charged once.
    """
    from langgraph.runtime import Runtime

    world = World(tmp_path)
    world.crash.touch()
    tools = DurableTools(FileStore(tmp_path / "runs", sync=False))

    def charge_node(state: MessagesState, runtime: Runtime[None]) -> dict[str, list[Any]]:
        def charge() -> str:
            with world.charges.open("a") as out:
                out.write(tool_context().idempotency_key + "\n")
            return "charged 500"

        result = tools.effect(runtime, charge, name="charge", effect="keyed")
        if world.crash.exists():
            world.crash.unlink()
            raise Crash
        return {"messages": [AIMessage(content=result, id="charged")]}

    builder = StateGraph(MessagesState)
    builder.add_node("charge", charge_node)
    builder.add_edge(START, "charge")
    with DurablySaver(tmp_path / "threads") as saver:
        graph = builder.compile(checkpointer=saver)
        with pytest.raises(Crash):
            graph.invoke({"messages": [HumanMessage("go", id="q")]}, THREAD, durability="sync")
        final = graph.invoke(None, THREAD, durability="sync")
    assert final["messages"][-1].content == "charged 500"
    assert world.count(world.charges) == 1, "the node's charge ran again"
