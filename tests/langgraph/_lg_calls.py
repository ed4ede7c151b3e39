"""Raw saver calls on thread ``t``: a checkpoint per id (its parent the one before), writes."""

from __future__ import annotations

from typing import Any

from durably.langgraph import DurablySaver


def checkpoint(cid: int) -> dict[str, Any]:
    return {
        "v": 1,
        "id": f"{cid:04d}",
        "ts": "2026-01-01T00:00:00+00:00",
        "channel_values": {"x": cid},
        "channel_versions": {"x": str(cid)},
        "versions_seen": {},
        "updated_channels": None,
    }


def put(saver: DurablySaver, cid: int) -> None:
    config: dict[str, Any] = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    if cid > 1:
        config["configurable"]["checkpoint_id"] = f"{cid - 1:04d}"
    saver.put(config, checkpoint(cid), {"step": cid}, {"x": str(cid)})  # type: ignore[arg-type]


def put_writes(saver: DurablySaver, cid: int, task: str) -> None:
    config: Any = {
        "configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": f"{cid:04d}"}
    }
    saver.put_writes(config, [("x", f"{task}@{cid}")], task)
