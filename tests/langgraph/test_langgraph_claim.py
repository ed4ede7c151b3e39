"""A thread is claimed before anything runs, and a writer that read before another wrote is refused.

Two real processes resume one thread whose next step charges a card
(``_lg_claim_child.py``). With docs/langgraph.md's recipe (claim, then read and
invoke), the second gets ``ThreadLocked`` before any node runs while the first is
still charging, and finds the thread finished once the first is done: one charge
either way. Without the claim, a process that read the thread before the other
wrote it is refused at its first put (``StaleThread``): the chain does not fork.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _lg_agent import build, question

from _helpers.patience import stretched
from durably.langgraph import DurablySaver, ThreadLocked

CHILD = Path(__file__).with_name("_lg_claim_child.py")


class Thread:
    """The thread's directory, the charges file and the gates of the processes run on it."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.directory = tmp_path / "threads"
        self.charges = tmp_path / "charges"
        self.charges.touch()
        assert self.finish(self.start("setup")) == {"how": "set up"}
        assert self.count() == 0

    def start(self, mode: str, gate: str = "-") -> subprocess.Popen[str]:
        """Start a process in ``mode``; with a gate, its charge waits for :meth:`open`."""
        gate_path = "-" if gate == "-" else str(self.tmp / gate)
        argv = [str(self.directory), "t", mode, str(self.charges), gate_path]
        return subprocess.Popen(
            [sys.executable, str(CHILD), *argv], stdout=subprocess.PIPE, text=True
        )

    def open(self, gate: str) -> None:
        """Let a process waiting in its charge go on."""
        (self.tmp / gate).touch()

    def finish(self, process: subprocess.Popen[str]) -> dict[str, Any]:
        """Wait for a process; what it printed."""
        out, _ = process.communicate(timeout=stretched(300))
        assert process.returncode == 0, out
        result: dict[str, Any] = json.loads(out)
        return result

    def count(self) -> int:
        """How many charges were made."""
        return len(self.charges.read_text().splitlines())

    def wait_for_charges(self, n: int) -> None:
        """Wait until ``n`` charges were made."""
        deadline = time.monotonic() + stretched(300)  # only a very slow machine gets near it
        while self.count() < n:
            assert time.monotonic() < deadline, f"no {n} charge(s) in 300 s"
            time.sleep(0.05)

    def children(self) -> Counter[str | None]:
        """How many checkpoints name each checkpoint as their parent (2 or more: a fork)."""
        with DurablySaver(self.directory) as reader:
            found = list(reader.list({"configurable": {"thread_id": "t"}}))
        return Counter(
            c.parent_config["configurable"]["checkpoint_id"] if c.parent_config else None
            for c in found
        )

    def finished(self) -> bool:
        """Whether the thread's latest checkpoint is the end of the run."""
        with DurablySaver(self.directory) as reader:
            latest = reader.get_tuple({"configurable": {"thread_id": "t"}})
        assert latest is not None
        messages = latest.checkpoint["channel_values"]["messages"]
        return bool(messages[-1].content == "charged" and not latest.checkpoint.get("next"))


def assert_no_fork(thread: Thread) -> None:
    """No checkpoint of the thread has two children."""
    forks = {parent: n for parent, n in thread.children().items() if n > 1}
    assert not forks, f"checkpoints with more than one child: {forks}"


def test_a_second_process_is_refused_before_any_node_runs_while_the_first_charges(
    tmp_path: Path,
) -> None:
    """The first still writing: the second's claim raises ThreadLocked; one charge, no fork."""
    thread = Thread(tmp_path)
    first = thread.start("recipe", gate="first-gate")
    thread.wait_for_charges(1)  # the first is inside its charge, holding the thread
    second = thread.finish(thread.start("recipe"))
    assert second.get("error") == "ThreadLocked", (second, f"{thread.count()} charges")
    assert "'t' is being written by another process" in second["message"]
    assert thread.count() == 1, "the second process ran the charge"
    thread.open("first-gate")
    assert thread.finish(first) == {"how": "ran"}
    assert thread.count() == 1
    assert thread.finished()
    assert_no_fork(thread)


def test_a_second_process_after_the_first_finished_runs_nothing(tmp_path: Path) -> None:
    """The first already finished: the second claims, finds the thread done; one charge, no fork."""
    thread = Thread(tmp_path)
    assert thread.finish(thread.start("recipe")) == {"how": "ran"}
    assert thread.count() == 1
    assert thread.finish(thread.start("recipe")) == {"how": "ran"}
    assert thread.count() == 1, "the second process charged a finished thread"
    assert thread.finished()
    assert_no_fork(thread)


def test_a_writer_that_read_before_another_wrote_is_refused_and_the_chain_does_not_fork(
    tmp_path: Path,
) -> None:
    """Unclaimed, a process reads the thread and charges; meanwhile another resumes it to the
    end and lets go. The first's put, built on its old read, raises StaleThread: no fork.

    (It has charged twice: that is what claiming first prevents, as the tests above show.)
    """
    thread = Thread(tmp_path)
    stale = thread.start("unclaimed", gate="stale-gate")
    thread.wait_for_charges(1)  # it has read the thread and is inside its charge
    assert thread.finish(thread.start("recipe")) == {"how": "ran"}
    thread.open("stale-gate")
    refused = thread.finish(stale)
    assert_no_fork(thread)
    assert refused.get("error") == "StaleThread", refused
    assert "moved on since this saver read it" in refused["message"]
    assert "saver.claim(thread_id)" in refused["message"]
    assert thread.finished()
    assert_no_fork(thread)


def test_a_fork_from_a_chosen_checkpoint_is_still_a_put_like_any_other(tmp_path: Path) -> None:
    """Replaying or updating a checkpoint addressed by its checkpoint_id forks on purpose: allowed,
    even after this saver read the thread's latest, which has moved past that checkpoint.
    """
    config: Any = {"configurable": {"thread_id": "t"}}
    with DurablySaver(tmp_path / "threads") as saver:
        graph = build(saver, rounds=2)
        graph.invoke(question(), config, durability="sync")
        history = list(graph.get_state_history(config))
        assert graph.get_state(config).next == ()  # read as the latest, then moved past below
        chosen = history[2].config  # an older checkpoint, with children already
        replayed = graph.invoke(None, chosen, durability="sync")
        assert replayed["messages"][-1].content == "done after 2 lookups"
        graph.update_state(history[3].config, {"messages": []})
    with DurablySaver(tmp_path / "threads") as reader:
        found = list(reader.list(config))
    children = Counter(
        c.parent_config["configurable"]["checkpoint_id"] if c.parent_config else None for c in found
    )
    assert max(children.values()) >= 2, "the replay and the update forked the chain, as asked"


def test_aclaim_takes_the_lock_before_anything_is_written_and_claiming_twice_is_harmless(
    tmp_path: Path,
) -> None:
    """``aclaim`` (and ``claim``) lock a thread nothing was written to yet; a second saver is
    refused at once, its own claim again changes nothing, and ``release`` lets the other in.
    """
    with DurablySaver(tmp_path / "threads") as first, DurablySaver(tmp_path / "threads") as second:
        asyncio.run(first.aclaim("t"))
        first.claim("t")
        with pytest.raises(ThreadLocked, match="'t' is being written by another process"):
            second.claim("t")
        assert first.get_tuple({"configurable": {"thread_id": "t"}}) is None, "nothing written"
        first.release("t")
        second.claim("t")
