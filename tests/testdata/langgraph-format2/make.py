"""Writes ``threads/`` and ``expected.json``: a thread in the format 2 layout (one log).

Run once with the code of commit 1b9cc39 (format 2 headers, pending writes in the
thread's one log); kept to show where the files came from::

    .venv/bin/python tests/testdata/langgraph-format2/make.py
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "langgraph"))

from _lg_agent import build, question  # noqa: E402
from langchain_core.runnables import RunnableConfig  # noqa: E402

from durably.langgraph import DurablySaver  # noqa: E402

shutil.rmtree(HERE / "threads", ignore_errors=True)
config: RunnableConfig = {"configurable": {"thread_id": "old"}}
with DurablySaver(HERE / "threads") as saver:
    build(saver, rounds=2).invoke(question(), config, durability="sync")
    expected = {
        found.checkpoint["id"]: {
            "messages": len(found.checkpoint["channel_values"].get("messages", [])),
            "writes": sorted([task, channel] for task, channel, _ in found.pending_writes or []),
        }
        for found in saver.list(config)
    }
(HERE / "threads" / "old.lock").unlink()
(HERE / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
