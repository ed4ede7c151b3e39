"""A real agent process killed after a real service acted: the effect happens once.

Each scenario runs the agent in a child process that SIGKILLs itself right after
``place_order`` returned and before its result was saved (the crash window no
local bookkeeping can close), then resumes the run in a new process. The
service runs in processes of its own: uvicorn over loopback HTTP, or an MCP
server over stdio.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
from _orders_world import jsonl, order_service, run_agent

from durably import idempotency_key

RUN_ID = "orders-run"  # as in _orders_agent.py
KEY = idempotency_key(RUN_ID, "c1")
ORDER_ONE = '{"item": "widget", "order": 1, "quantity": 2, "reference": "po-17"}'


def crash_then_resume(config: dict[str, Any], service_dir: Path) -> dict[str, Any]:
    """Run until the crash point kills the agent, resume in a new process, return the outcome."""
    died = run_agent({**config, "command": "run"})
    assert died.returncode == -signal.SIGKILL, died.stderr
    assert len(jsonl(service_dir / "effects.jsonl")) == 1  # the service acted before the crash
    resumed = run_agent({**config, "command": "resume"})
    assert resumed.returncode == 0, resumed.stderr
    outcome: dict[str, Any] = json.loads(resumed.stdout)
    return outcome


def test_keyed_http_call_is_replayed_by_the_middleware_not_repeated(
    service_dir: Path, agent_files: dict[str, str]
) -> None:
    """A keyed HTTP call cut off by SIGKILL reruns with the same key and the service replays it."""
    with order_service(service_dir, keys=True) as (url, _):
        outcome = crash_then_resume(
            {**agent_files, "transport": "http", "base_url": url, "effect": "keyed"}, service_dir
        )
    assert len(jsonl(service_dir / "effects.jsonl")) == 1
    posts = [r for r in jsonl(service_dir / "requests.jsonl") if r["method"] == "POST"]
    assert [r["key"] for r in posts] == [KEY, KEY]
    assert outcome["resolutions"] == {"c1": [1, "rerun"]}
    assert outcome["results"] == {"c1": ORDER_ONE}
    assert outcome["status"] == "done"
    assert not Path(agent_files["questions"]).exists()


def test_a_keyed_call_past_its_key_ttl_is_found_through_the_middlewares_lookup(
    service_dir: Path, agent_files: dict[str, str]
) -> None:
    """Past key_ttl the agent does not resend; it asks /idempotency/{key} and finds the call."""
    with order_service(service_dir, keys=True) as (url, _):
        config = {"transport": "http", "base_url": url, "effect": "keyed", "lookup": "key"}
        outcome = crash_then_resume({**agent_files, **config, "key_ttl": 0.001}, service_dir)
    requests = jsonl(service_dir / "requests.jsonl")
    assert [(r["method"], r["path"]) for r in requests] == [
        ("POST", "/orders"),
        ("GET", f"/idempotency/{KEY}"),
    ]
    assert len(jsonl(service_dir / "effects.jsonl")) == 1
    assert outcome["resolutions"] == {"c1": [2, "found"]}
    assert outcome["results"] == {"c1": ORDER_ONE}
    assert not Path(agent_files["questions"]).exists()


@pytest.mark.parametrize(
    ("lookup", "resolve", "decided"),
    [("reference", None, [2, "found"]), (None, "done", [3, "done"])],
    ids=["step-2-lookup", "step-3-person"],
)
def test_write_call_to_a_service_ignoring_keys_is_never_rerun_blindly(
    service_dir: Path,
    agent_files: dict[str, str],
    lookup: str | None,
    resolve: str | None,
    decided: list[Any],
) -> None:
    """Without the middleware, an honest write tool goes to its lookup or a person, not a rerun."""
    with order_service(service_dir, keys=False) as (url, _):
        outcome = crash_then_resume(
            {
                **agent_files,
                "transport": "http",
                "base_url": url,
                "effect": "write",
                "lookup": lookup,
                "resolve": resolve,
            },
            service_dir,
        )
    assert len(jsonl(service_dir / "effects.jsonl")) == 1
    assert [r["method"] for r in jsonl(service_dir / "requests.jsonl")].count("POST") == 1
    assert outcome["resolutions"] == {"c1": decided}
    questions = jsonl(Path(agent_files["questions"]))
    if lookup:
        assert outcome["results"] == {"c1": ORDER_ONE}
        assert questions == []
    else:
        assert outcome["results"] == {"c1": "a person checked: order po-17 was placed"}
        assert questions == [{"kind": "resolve", "call_id": "c1"}]
    assert outcome["status"] == "done"


def test_keyed_mcp_call_is_replayed_by_the_server_not_repeated(
    service_dir: Path, agent_files: dict[str, str]
) -> None:
    """A keyed MCP call cut off by SIGKILL reruns with its key in _meta; the server replays it."""
    outcome = crash_then_resume(
        {**agent_files, "transport": "mcp", "server_dir": str(service_dir), "effect": "keyed"},
        service_dir,
    )
    assert len(jsonl(service_dir / "effects.jsonl")) == 1
    received = jsonl(service_dir / "received.jsonl")
    assert [r["meta"].get("io.durably/idempotency-key") for r in received] == [KEY, KEY]
    assert [r["arguments"] for r in received] == [
        {"item": "widget", "quantity": 2, "reference": "po-17"}
    ] * 2
    assert all(KEY not in json.dumps(r["arguments"]) for r in received)
    assert outcome["resolutions"] == {"c1": [1, "rerun"]}
    assert outcome["results"] == {"c1": '{"item": "widget", "order": 1, "quantity": 2}'}
    assert outcome["status"] == "done"
    assert not Path(agent_files["questions"]).exists()
