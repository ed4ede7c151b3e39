"""A fork server for the saver's process tests: imports LangGraph once, forks a process per job.

Started as ``python _lg_child.py``; reads one JSON command per line on stdin and
answers one JSON line on stdout. Importing LangGraph takes seconds, forking
milliseconds, and every job still runs in a process of its own that dies for real.

Commands (``dir``, ``thread``, ``rounds`` name the saver's directory, the thread
and the agent's length; ``effects`` is a file the ``lookup`` tool appends to):

- ``run``: run the agent on a fresh input with ``durability="sync"``. With ``at``
  the process is SIGKILLed at the ``at``-th crash point (``durably.faults``); with
  ``kill_after`` the server SIGKILLs it after that many seconds. Answers whether it
  was killed, the crash points it reached, the final conversation, or the error.
- ``resume``: what a restarted service does for the thread (see ``resume_thread``).
- ``hold``: run the agent, then keep the saver (and the thread's lock) open until
  killed; answers with the process ID once the run is done.
- ``kill``: SIGKILL a held process and reap it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from _lg_agent import build, question, summary

from durably.faults import CrashPlan, installed
from durably.langgraph import DurablySaver, ThreadLocked


def _config(thread: str) -> Any:
    return {"configurable": {"thread_id": thread}, "recursion_limit": 1000}


def run_thread(directory: str, thread: str, rounds: int) -> dict[str, Any]:
    """Run the agent on its question; the final conversation."""
    with DurablySaver(directory, sync=False) as saver:
        final = build(saver, rounds=rounds).invoke(question(), _config(thread), durability="sync")
    return {"summary": summary(final["messages"])}


def resume_thread(directory: str, thread: str, rounds: int) -> dict[str, Any]:
    """The restart recipe of docs/langgraph.md: no checkpoint, start again; else carry on.

    Carrying on is ``invoke(None)`` whenever a checkpoint exists, even when
    ``get_state().next`` is empty: a step whose tasks all saved their writes but
    whose checkpoint was not saved yet shows no ``next`` and is not finished.
    """
    with DurablySaver(directory, sync=False) as saver:
        graph = build(saver, rounds=rounds)
        snapshot = graph.get_state(_config(thread))
        if snapshot.created_at is None:
            how, final = "started", graph.invoke(question(), _config(thread), durability="sync")
        else:
            how = "resumed" if snapshot.tasks else "finished"
            final = graph.invoke(None, _config(thread), durability="sync")
        after = graph.get_state(_config(thread))
    return {"summary": summary(final["messages"]), "how": how, "next": list(after.next)}


def _child(job: dict[str, Any], out: int) -> None:
    os.environ["LG_EFFECTS"] = job.get("effects", "")
    result: dict[str, Any]
    plan = CrashPlan(at=job.get("at"))
    started = time.monotonic()
    try:
        with installed(plan):
            if job["cmd"] == "resume":
                result = resume_thread(job["dir"], job["thread"], job["rounds"])
            else:
                result = run_thread(job["dir"], job["thread"], job["rounds"])
    except ThreadLocked as exc:
        result = {"error": "ThreadLocked", "message": str(exc)}
    except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
        result = {"error": type(exc).__name__, "message": "".join(traceback.format_exception(exc))}
    result["reached"] = plan.reached
    result["seconds"] = time.monotonic() - started
    os.write(out, json.dumps(result).encode())
    os.close(out)


def _fork(job: dict[str, Any], *, hold: bool = False) -> tuple[int, int]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the job's own process
        os.close(read)
        try:
            if hold:
                saver = DurablySaver(job["dir"], sync=False)
                build(saver, rounds=job["rounds"]).invoke(
                    question(), _config(job["thread"]), durability="sync"
                )
                os.write(write, b"ready")
                os.close(write)
                while True:
                    signal.pause()
            _child(job, write)
        finally:
            os._exit(0)
    os.close(write)
    return pid, read


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def serve() -> None:
    """Answer commands until stdin closes."""
    with tempfile.TemporaryDirectory() as warm:  # so forks inherit a warmed-up LangGraph
        run_thread(str(Path(warm, "threads")), "warm-up", 1)
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        if job["cmd"] == "kill":
            os.kill(job["pid"], signal.SIGKILL)
            os.waitpid(job["pid"], 0)
            print(json.dumps({"killed": True}), flush=True)
            continue
        if job["cmd"] == "hold":
            pid, read = _fork(job, hold=True)
            print(json.dumps({"pid": pid, "ready": _read_all(read).decode()}), flush=True)
            continue
        pid, read = _fork(job)
        if job.get("kill_after") is not None:
            time.sleep(job["kill_after"])
            os.kill(pid, signal.SIGKILL)
        data = _read_all(read)
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        answer = {"killed": killed, "result": json.loads(data) if data and not killed else None}
        if killed and data:
            answer["partial"] = True
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    serve()
