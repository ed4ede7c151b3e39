"""A Pydantic AI run with ``Durable`` through durably's other doors: streamed
(``run_stream_events``, ``iter``, ``run_stream``), resumed by ``durably resume --agent``,
and answered in the console.

Crashes are real: a forked child runs the agent under a crash plan that sends it
SIGKILL at a named save point, and the test process carries the run on.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _pai_world import build
from starlette.testclient import TestClient

import durably
from _helpers.patience import stretched
from _helpers.refund_world import ANSWER, NOTE, TASK, Service
from durably import faults
from durably.console.server import create_app
from durably.engine import SavePoint
from durably.pydantic_ai import Durable, RunPaused, worker_agent
from durably.state import ResolutionOutcome
from durably.storechoice import StoreChoice
from durably.sweep import RUN_ID, run_in_child
from pydantic_ai import Agent

TESTS = Path(__file__).parent
REFERENCE = {"refund 1042": 1, "email a@b.c: order 1042 is refunded": 1, f"note {NOTE}": 1}
TOKEN = "t0ken-for-tests"  # noqa: S105 (a test token, not a secret)


class World:
    """A store directory, the fake service and the model's call log under one root."""

    def __init__(self, root: Path, **service: Any) -> None:
        self.root = root
        self.service = Service(root / "service", **service)
        self.service.prepare()
        self.log = durably.CallLog(root / "model.jsonl")

    def agent(self, **options: Any) -> tuple[Agent[None, str], Durable]:
        """The agent with a streaming model, built anew as a restarted process builds it."""
        store = durably.FileStore(self.root / "runs", sync=False)
        return build(store, self.service, self.log, streaming=True, **options)

    def state(self) -> durably.RunState:
        """The run's saved state."""
        store = durably.FileStore(self.root / "runs", sync=False)
        try:
            return store.read_sync(RUN_ID)
        finally:
            store.close_sync()

    def killed_at(
        self, label: str, run: Callable[[Agent[None, str]], Any], occurrence: int = 1
    ) -> None:
        """Run ``run(agent)`` in a child that SIGKILLs itself at ``label``; assert it died so."""

        def body() -> None:
            agent, _ = self.agent()
            with faults.installed(faults.CrashPlan(label=label, occurrence=occurrence)):
                asyncio.run(run(agent))

        status = run_in_child(body)
        assert os.WIFSIGNALED(status), status
        assert os.WTERMSIG(status) == signal.SIGKILL, status


def text_of(event: object) -> str:
    """The text a streamed event adds: a text part's start, or a text delta."""
    from pydantic_ai.messages import PartDeltaEvent, PartStartEvent, TextPart, TextPartDelta

    if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
        return event.part.content
    if isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
        return event.delta.content_delta
    return ""


async def by_events(agent: Agent[None, str]) -> tuple[str, str]:
    """``agent.run_stream_events``: the streamed text of every reply, and the output."""
    from pydantic_ai.run import AgentRunResultEvent

    streamed, output = [], ""
    async with agent.run_stream_events(TASK, run_id=RUN_ID) as events:
        async for event in events:
            streamed.append(text_of(event))
            if isinstance(event, AgentRunResultEvent):
                output = event.result.output
    return "".join(streamed), output


async def by_iter(agent: Agent[None, str]) -> tuple[str, str]:
    """``agent.iter`` streaming each model request node: the streamed text, and the output."""
    streamed = []
    async with agent.iter(TASK, run_id=RUN_ID) as run:
        async for node in run:
            if Agent.is_model_request_node(node):
                async with node.stream(run.ctx) as stream:
                    streamed += [text_of(event) async for event in stream]
    assert run.result is not None
    return "".join(streamed), run.result.output


async def by_run_stream(agent: Agent[None, str]) -> tuple[str, str]:
    """``agent.run_stream``: the streamed text of the reply that ends the run, and the output."""
    async with agent.run_stream(TASK, run_id=RUN_ID) as result:
        texts = [text async for text in result.stream_text(delta=True)]
        return "".join(texts), await result.get_output()


STREAMS = {"run_stream_events": by_events, "iter": by_iter, "run_stream": by_run_stream}


@pytest.mark.parametrize("how", sorted(STREAMS))
@pytest.mark.parametrize(
    ("point", "occurrence"),
    [("loop.tool_returned:refund", 1), (SavePoint.REPLY.crash_point, 4)],
)
def test_a_streamed_run_killed_resumes_streaming_saved_replies_unpaid(
    tmp_path: Path, how: str, point: str, occurrence: int
) -> None:
    """A streamed run killed after its refund acted (or after its last reply was saved),
    streamed again, does each effect once and streams the saved replies back without
    asking the model for them: a streamed reply is saved once, when its stream ends.
    """
    world = World(tmp_path)
    stream = STREAMS[how]
    world.killed_at(point, stream, occurrence=occurrence)
    saved = world.state().turns
    asked = world.log.turns(RUN_ID)

    agent, _ = world.agent()
    text, output = asyncio.run(stream(agent))

    assert output == ANSWER
    assert text == ANSWER  # the last reply, streamed fresh or from its save
    assert [t for t in world.log.turns(RUN_ID)[len(asked) :] if t <= saved] == []
    assert world.service.effects() == REFERENCE
    assert world.state().answer == ANSWER
    if occurrence == 4:  # every reply was saved: none is asked for again
        assert world.log.turns(RUN_ID) == asked == [1, 2, 3, 4]


def test_run_stream_refuses_calls_of_a_reply_still_streaming(tmp_path: Path) -> None:
    """``run_stream`` ends at a reply's first text and runs that reply's calls before its
    stream is over: the reply cannot be saved first, so the call is refused, never run
    unprotected, with an error naming what to use instead.
    """
    world = World(tmp_path)
    agent, _ = world.agent(text_with_calls=True)

    with pytest.raises(ValueError, match=r"still streaming.*run_stream_events"):
        asyncio.run(by_run_stream(agent))
    assert world.service.effects() == {}


def _cli(*args: str, root: Path) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ,
        "NO_COLOR": "1",
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)]),
        "DURABLY_TEST_ROOT": str(root),
    }
    return subprocess.run(
        [sys.executable, "-m", "durably", *args],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
        timeout=stretched(120),
        env=environment,
    )


@pytest.mark.parametrize("store", [(), ("runs",)])
def test_durably_resume_carries_a_killed_pydantic_ai_run_on(
    tmp_path: Path, store: tuple[str, ...]
) -> None:
    """``durably resume RUN [STORE] --agent MODULE:FACTORY`` with a factory that returns
    ``worker_agent(agent)`` finishes a run killed after its refund acted: each effect once,
    no saved reply asked for again, the restart counted.
    """
    world = World(tmp_path)
    world.killed_at("loop.tool_returned:refund", by_events)
    asked = world.log.turns(RUN_ID)

    resumed = _cli("resume", RUN_ID, *store, "--agent", "_pai_cli_agents:refunds", root=tmp_path)

    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"done: {RUN_ID}" in resumed.stdout
    assert world.log.turns(RUN_ID) == [*asked, 3, 4]
    assert world.service.effects() == REFERENCE
    assert world.state().resumes == 1


def test_durably_resume_names_the_wrapper_a_bare_pydantic_ai_agent_needs(tmp_path: Path) -> None:
    """A factory that returns the Pydantic AI agent itself is refused with what to wrap it in."""
    world = World(tmp_path)
    world.killed_at("loop.tool_returned:refund", by_events)
    asked, before = world.log.turns(RUN_ID), world.state()

    resumed = _cli("resume", RUN_ID, "runs", "--agent", "_pai_cli_agents:bare", root=tmp_path)

    assert resumed.returncode == 2, resumed.stdout + resumed.stderr
    assert "durably.pydantic_ai.worker_agent(agent)" in resumed.stderr
    assert world.service.effects() == {"refund 1042": 1}  # the one before the kill
    assert world.log.turns(RUN_ID) == asked
    assert world.state().saved_at == before.saved_at


def test_worker_agent_refuses_an_agent_without_durable() -> None:
    """``worker_agent`` of an agent with no ``Durable`` would run it unprotected: refused."""
    from pydantic_ai.models.test import TestModel

    with pytest.raises(TypeError, match="exactly one Durable capability, found 0"):
        worker_agent(Agent(TestModel()))


def test_the_console_lists_the_run_and_its_answer_carries_it_on(tmp_path: Path) -> None:
    """A Pydantic AI run paused on an in-doubt note shows on the console's runs, run and
    questions pages; ``done`` answered there settles it, and the resumed run finishes with
    the note posted once, not counted as a restart.
    """
    world = World(tmp_path, doubt=frozenset({"notes"}))
    agent, durable = world.agent()
    with pytest.raises(RunPaused) as paused:
        asyncio.run(agent.run(TASK, run_id=RUN_ID))
    (call_id,) = paused.value.call_ids
    root = f"/t/{TOKEN}/"
    app = create_app(StoreChoice(directory=tmp_path / "runs"), token=TOKEN)

    with TestClient(app, base_url="http://127.0.0.1", follow_redirects=False) as client:
        assert RUN_ID in client.get(root).text
        questions = client.get(f"{root}questions").text
        assert re.search(rf'id="q-{call_id}"', questions), questions
        assert "post_note" in client.get(f"{root}runs/{RUN_ID}").text
        answered = client.post(
            f"{root}runs/{RUN_ID}/answer",
            data={"call": call_id, "answer": "done", "result": "noted (seen in the console)"},
        )
        assert answered.status_code == 303, answered.text
    assert world.state().resolutions[call_id].outcome is ResolutionOutcome.DONE
    assert world.state().resolutions[call_id].by == "console"

    world.service.doubt = frozenset()
    agent, durable = world.agent()
    asyncio.run(durable.resume(agent, RUN_ID))

    assert world.service.effects() == REFERENCE
    assert world.state().answer == ANSWER
    assert world.state().resumes == 0
