"""A ``create_agent`` graph with ``DurableTools`` against a fake service that counts its effects.

The agent runs on langchain-core's scripted chat model (no network) and has four
tools, one of each kind durably distinguishes:

- ``refund``: keyed (the service deduplicates on the idempotency key when keys are
  honoured; declared ``write`` with a lookup by key when they are not);
- ``send_email``: a write without a key, with a lookup by content;
- ``post_note``: a write without a key and without a lookup (a person decides);
- ``get_order``: a read.

The reply calling ``send_email`` and ``post_note`` calls both: ``create_agent`` runs
them as two parallel tasks. The service is a directory of JSON-lines files, one
line per effect, so it survives the SIGKILL of the process that called it; it
passes a crash point (``service.did:<kind>``) after each effect, before its
answer reaches the tool. The model passes one after each reply
(``model.replied``), and, when asked for a reply the thread already saved, says
so in ``asked-again.txt`` (the judge fails the scenario).

:class:`LangGraphJob` is this world as a ``durably.sweep`` job. Its ``sqlite``
form is the same graph on ``SqliteSaver`` alone (no ``DurableTools``): a baseline
the sweep shows repeating effects. That form has no durably run, so when its
graph finishes the harness records one as done (the sweep's judge reads it).
"""

from __future__ import annotations

import json
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool, tool

import durably
from _helpers import refund_world
from _helpers.refund_world import ANSWER, EMAIL, NOTE, TASK, RefundJob
from durably import faults
from durably.langgraph import DurableTools, DurablySaver, tool_context
from durably.state import Phase, RunState, UserMessage, utcnow
from durably.stores import Store
from durably.sweep import RUN_ID, Config, World, digest_files

THREAD: Any = {"configurable": {"thread_id": RUN_ID}}


class Service(refund_world.Service):
    """The refunds service, passing a crash point after each effect it writes."""

    def after_write(self, name: str) -> None:
        """The crash point ``service.did:<kind>``: the effect done, its answer not yet back."""
        faults.point(f"service.did:{name}")


def script(turn: int, again: int) -> AIMessage:
    """The model's reply for ``turn``; ``again`` > 0 when it was asked for it before."""
    suffix = f"-again{again}" if again else ""
    usage: Any = {"input_tokens": 100 * turn, "output_tokens": 20, "total_tokens": 100 * turn + 20}
    if turn == 1:
        calls = [{"name": "get_order", "args": {"order": "1042"}, "id": f"c1{suffix}"}]
        text = "Looking the order up."
    elif turn == 2:
        calls = [{"name": "refund", "args": {"order": "1042", "cents": 500}, "id": f"c2{suffix}"}]
        text = "Refunding it."
    elif turn == 3:
        calls = [
            {"name": "send_email", "args": dict(EMAIL), "id": f"c3{suffix}"},
            {"name": "post_note", "args": {"text": NOTE}, "id": f"c4{suffix}"},
        ]
        text = ""
    else:
        calls, text = [], ANSWER
    return AIMessage(
        content=text, tool_calls=calls, id=f"reply-{turn}{suffix}", usage_metadata=usage
    )


class ScriptedModel(FakeMessagesListChatModel):
    """Answers turn ``n`` (replies already in the input, plus one) from :func:`script`."""

    log: Any = None
    """The world's ``durably.CallLog``: every ask, by turn."""
    fickle: bool = False
    threads: Any = None
    """The thread's directory, to tell a saved reply asked for again (None: not judged)."""
    asked_again: Any = None

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        """The script knows its tools."""
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        turn = sum(isinstance(m, AIMessage) for m in messages) + 1
        if self.threads is not None and _saved_replies(Path(self.threads)) >= turn:
            with Path(self.asked_again).open("a") as out:
                out.write(f"the model was asked again for the saved reply of turn {turn}\n")
        again = self.log.turns(RUN_ID).count(turn) if self.fickle else 0
        self.log.append(RUN_ID, turn)
        reply = script(turn, again)
        faults.point("model.replied")
        return ChatResult(generations=[ChatGeneration(message=reply)])


def _saved_replies(threads: Path) -> int:
    """The model replies the thread's checkpoints and pending writes hold (read, no lock)."""
    with DurablySaver(threads, sync=False) as reader:
        latest = reader.get_tuple(THREAD)
    if latest is None:
        return 0
    messages = list(latest.checkpoint["channel_values"].get("messages", []))
    for _task, channel, value in latest.pending_writes or ():
        if channel == "messages":
            messages += value if isinstance(value, list) else [value]
    return len({m.id for m in messages if isinstance(m, AIMessage)})


def tools_for(service: Service, config: Config) -> list[BaseTool]:
    """The four tools, declared as ``config``'s harness declares them (in their metadata)."""
    refund_meta: dict[str, Any] = (
        {"effect": "keyed", "key_ttl": timedelta(hours=24).total_seconds()}
        if config.honour_keys
        else {"effect": "write"}
    )

    def key() -> str | None:
        try:
            return tool_context().idempotency_key
        except RuntimeError:  # SqliteSaver alone: no durably context, so no key to send
            return None

    @tool
    def refund(order: str, cents: int) -> str:
        """Refund an order."""
        return service.refund(order=order, key=key())

    @tool
    def send_email(to: str, text: str) -> str:
        """E-mail a customer."""
        return service.send_email(to=to, text=text)

    @tool
    def post_note(text: str) -> str:
        """Post a note on the order."""
        return service.post_note(text=text)

    @tool
    def get_order(order: str) -> str:
        """Read an order."""
        return json.dumps({"order": order, "cents": 500})

    declared = [refund_meta, {"effect": "write"}, {"effect": "write"}, {"effect": "read"}]
    tools = [refund, send_email, post_note, get_order]
    for one, metadata in zip(tools, declared, strict=True):
        one.metadata = metadata
    return tools


def durable_tools(
    store: Store, service: Service, config: Config, approver: durably.Approver | None
) -> DurableTools:
    """``DurableTools`` with the world's lookups (by key for refunds, by content for e-mails)."""

    async def find_refund(ctx: durably.ToolContext, order: str, cents: int) -> durably.Lookup:
        for entry in service.lines("refunds"):
            if entry["key"] == ctx.idempotency_key:
                return durably.Found(f"refund {entry['id']}")
        return durably.NOT_FOUND

    async def find_email(ctx: durably.ToolContext, to: str, text: str) -> durably.Lookup:
        sent = any(e == {"to": to, "text": text} for e in service.lines("emails"))
        return durably.Found(f"sent to {to}") if sent else durably.NOT_FOUND

    lookups: dict[str, Any] = {"refund": find_refund, "send_email": find_email}
    if not config.lookups:
        lookups = {"refund": find_refund} if config.honour_keys else {}
    return DurableTools(store, lookups=lookups, approver=approver)


class GraphAgent:
    """The graph as the sweep runs agents: ``run`` and ``resume`` are docs/langgraph.md's recipe."""

    def __init__(self, world: World, approver: durably.Approver, *, sqlite: bool) -> None:
        self.world, self.sqlite = world, sqlite
        self.service = Service(world.root / "service", honour_keys=world.config.honour_keys)
        self.model = ScriptedModel(
            responses=[],
            log=durably.CallLog(world.root / "model.jsonl"),
            fickle=world.config.fickle,
            threads=None if sqlite else str(world.root / "threads"),
            asked_again=str(world.root / "asked-again.txt"),
        )
        self.approver = approver

    async def run(self, task: str, *, run_id: str) -> object:
        """The recipe (nothing saved: start the thread)."""
        return await self._recipe()

    async def resume(self, run_id: str) -> object:
        """The recipe (a checkpoint saved: carry on from it)."""
        return await self._recipe()

    async def _recipe(self) -> object:
        inputs: Any = {"messages": [HumanMessage(content=TASK, id="task")]}
        tools = tools_for(self.service, self.world.config)
        if self.sqlite:
            from langgraph.checkpoint.sqlite import SqliteSaver

            conn = sqlite3.connect(self.world.root / "threads.sqlite", check_same_thread=False)
            try:
                graph = create_agent(self.model, tools, checkpointer=SqliteSaver(conn))
                _invoke(graph)(inputs)
            finally:
                conn.close()
            await self._record_done()
            return None
        store = self.world.store()
        try:
            durable = durable_tools(store, self.service, self.world.config, self.approver)
            with DurablySaver(self.world.root / "threads", sync=False) as saver:
                await saver.aclaim(RUN_ID)
                graph = create_agent(
                    self.model, tools, middleware=[durable.middleware()], checkpointer=saver
                )
                if (await graph.aget_state(THREAD)).created_at is None:
                    await graph.ainvoke(inputs, THREAD, durability="sync")
                else:
                    await graph.ainvoke(None, THREAD, durability="sync")
        finally:
            store.close_sync()
        return None

    async def _record_done(self) -> None:
        """SqliteSaver alone keeps no durably run: record one as done for the sweep's judge."""
        store = self.world.store()
        try:
            state = RunState(
                run_id=RUN_ID,
                task=TASK,
                created_at=utcnow(),
                messages=[UserMessage(text=TASK)],
                phase=Phase.DONE,
                answer=_final_answer(self.world, sqlite=True),
            )
            if RUN_ID in store.list_runs_sync():
                return
            handle = await store.create(state)
            await handle.close()
        finally:
            store.close_sync()


def _invoke(graph: Any) -> Any:
    def invoke(inputs: Any) -> Any:
        if graph.get_state(THREAD).created_at is None:
            return graph.invoke(inputs, THREAD, durability="sync")
        return graph.invoke(None, THREAD, durability="sync")

    return invoke


def _final_answer(world: World, *, sqlite: bool) -> str | None:
    """The text of the thread's last message, or None."""
    if sqlite:
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(world.root / "threads.sqlite", check_same_thread=False)
        try:
            latest = SqliteSaver(conn).get_tuple(THREAD)
        finally:
            conn.close()
    else:
        with DurablySaver(world.root / "threads", sync=False) as reader:
            latest = reader.get_tuple(THREAD)
    if latest is None:
        return None
    messages = latest.checkpoint["channel_values"].get("messages", [])
    return str(messages[-1].content) if messages else None


class LangGraphJob(RefundJob):
    """The world above as a ``durably.sweep`` job: the sweep's own judge, kills and table.

    The service, its judge and its oracle are the refunds world's (``RefundJob``); the
    graph, its checks and its files are this world's.

    Args:
        sqlite: the same graph on ``SqliteSaver`` alone, no ``DurableTools`` (a baseline).
    """

    def __init__(self, *, sqlite: bool = False) -> None:
        self.sqlite = sqlite
        self.name = "langgraph refunds" + (" (SqliteSaver alone)" if sqlite else "")

    def agent(self, world: World, approver: durably.Approver) -> GraphAgent:
        """The graph for this world, built anew in every process."""
        return GraphAgent(world, approver, sqlite=self.sqlite)

    def checks(self, world: World, state: durably.RunState) -> list[str]:
        """Problems: the thread did not end with the scripted answer; a saved reply re-asked."""
        failed = []
        answer = _final_answer(world, sqlite=self.sqlite)
        if answer != ANSWER:
            failed.append(f"wrong answer {answer!r}")
        again = world.root / "asked-again.txt"
        if again.exists():
            failed += sorted(set(again.read_text().splitlines()))
        return failed

    def fingerprint(self, world: World) -> str:
        """A digest of the files a crash could have changed (locks and temp files aside)."""
        files = [
            p
            for p in sorted(world.root.rglob("*"))
            if p.is_file() and not p.name.startswith(".") and not p.name.endswith(".lock")
        ]
        return digest_files(files)
