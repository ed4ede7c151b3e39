"""A keyed tool must send its key: one that never reads it is caught before a crash repeats it."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import warnings
from datetime import timedelta
from pathlib import Path

import httpx
import msgspec
import pytest

import durably
from _helpers.patience import stretched
from durably import Call, Effect, Reply, ToolContext
from durably.testing import FakeService, strict
from durably.transports import http_tool

CHILD = Path(__file__).parent / "_helpers" / "keyed_child.py"


def child(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the refund agent's child process with ``args``."""
    return subprocess.run(
        [sys.executable, str(CHILD), *args],
        capture_output=True,
        text=True,
        timeout=stretched(120),
        check=False,
    )


def refunds(root: Path) -> list[str]:
    """The refunds the payment service made."""
    return FakeService(root / "service").effects()


def test_a_kill_after_a_keyed_tool_that_ignores_its_key_refunds_twice_but_it_warned_first(
    tmp_path: Path,
) -> None:
    """The issue's case in real processes: a keyed refund that never sends its key, SIGKILLed
    after the service call and before the result save, refunds twice on resume; the first
    process warned, naming the tool and the fix, before it could.
    """
    killed = child("run", str(tmp_path), "ignores")
    resumed = child("resume", str(tmp_path), "ignores")

    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert "KeyNotSent: keyed tool 'refund' returned without reading ctx.idempotency_key" in (
        killed.stderr
    )
    assert "Send ctx.idempotency_key to the service" in killed.stderr
    assert resumed.returncode == 0, resumed.stderr
    assert refunds(tmp_path) == ["refund 1042", "refund 1042"]  # what the warning was about


def test_under_the_strict_setting_a_keyed_tool_that_ignores_its_key_fails_the_run(
    tmp_path: Path,
) -> None:
    """Under ``durably.testing.strict()`` the same process stops with ``KeyNotSent`` at the
    call, before the crash point, and the result is not saved: the test fails there.
    """
    failed = child("run", str(tmp_path), "ignores", "strict")

    assert failed.returncode == 1, failed.stderr
    assert "durably.tools.KeyNotSent: keyed tool 'refund'" in failed.stderr
    assert "the crash point was never reached" not in failed.stderr
    store = durably.FileStore(tmp_path / "runs")
    state = store.read_sync("refund-run")
    store.close_sync()
    assert (list(state.markers), state.answered()) == (["c1"], {})  # in doubt, no result saved


def test_a_keyed_tool_that_sends_its_key_refunds_once_after_the_same_kill(tmp_path: Path) -> None:
    """Fixed to send ``ctx.idempotency_key``, the same kill and resume refund once, unwarned,
    even under the strict setting.
    """
    killed = child("run", str(tmp_path), "sends", "strict")
    resumed = child("resume", str(tmp_path), "sends", "strict")

    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert "KeyNotSent" not in killed.stderr + resumed.stderr
    assert (resumed.returncode, resumed.stdout) == (0, "done\n"), resumed.stderr
    assert refunds(tmp_path) == ["refund 1042"]


def agent_with(tool: durably.Tool, store: Path) -> durably.Agent:
    """An agent calling ``tool`` twice, with no arguments, then answering."""
    model = durably.ScriptedModel(
        [
            Reply(calls=[Call("c1", tool.name, "{}")]),
            Reply(calls=[Call("c2", tool.name, "{}")]),
            Reply(text="done"),
        ]
    )
    return durably.Agent(model=model, tools=[tool], store=durably.FileStore(store))


def test_the_warning_comes_once_per_tool_and_names_it(tmp_path: Path) -> None:
    """With Python's default filter the warning is shown on the first such call only."""

    @durably.tool(effect=Effect.KEYED, key_ttl=timedelta(hours=1))
    async def charge(ctx: ToolContext) -> str:
        return "charged"

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        outcome = asyncio.run(agent_with(charge, tmp_path).run("charge twice"))

    assert outcome.status == "done"
    assert [type(w.message) for w in seen] == [durably.KeyNotSent]
    assert "'charge'" in str(seen[0].message)


def test_under_strict_the_error_leaves_the_run_instead_of_reaching_the_model(
    tmp_path: Path,
) -> None:
    """In strict mode the loop lets ``KeyNotSent`` out of ``run``; the model never sees it."""

    @durably.tool(effect=Effect.KEYED, key_ttl=timedelta(hours=1))
    async def charge(ctx: ToolContext) -> str:
        return "charged"

    with strict(), pytest.raises(durably.KeyNotSent, match="'charge'"):
        asyncio.run(agent_with(charge, tmp_path).run("charge"))


def test_tools_that_send_the_key_or_say_they_do_are_not_warned(tmp_path: Path) -> None:
    """Reading the key, ``key_check=False``, and ``http_tool`` (which sends the key itself)
    pass under the strict setting; other effects never need a key.
    """

    @durably.tool(effect=Effect.KEYED, key_ttl=timedelta(hours=1))
    async def reads(ctx: ToolContext) -> str:
        return ctx.idempotency_key

    @durably.tool(effect=Effect.KEYED, key_ttl=timedelta(hours=1), key_check=False)
    async def elsewhere(ctx: ToolContext) -> str:
        return durably.idempotency_key(ctx.run_id, ctx.call_id)  # sent some other way

    @durably.tool(effect=Effect.WRITE)
    async def write(ctx: ToolContext) -> str:
        return "written"

    class Empty(msgspec.Struct):
        pass

    seen: list[str] = []

    def service(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["Idempotency-Key"])
        return httpx.Response(201, text="ok")

    http = http_tool(
        name="http",
        description="Post.",
        method="POST",
        url="http://shop/orders",
        effect=Effect.KEYED,
        arguments=Empty,
        key_ttl=timedelta(hours=1),
        client=httpx.AsyncClient(transport=httpx.MockTransport(service)),
    )
    for index, tool in enumerate((reads, elsewhere, write, http)):
        with strict():
            outcome = asyncio.run(agent_with(tool, tmp_path / str(index)).run(tool.name))
        assert outcome.status == "done"
    assert len(seen) == 2
