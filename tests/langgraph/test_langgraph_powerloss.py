"""The power-loss model (``durably.sweep.powerloss``) over DurablySaver's files.

A real agent run, then a prune, are recorded on a ``PowerLossFS``: the run
writes the thread's log and its writes log, the prune rewrites both into the
next generation's log. At every point of the op log, every disk a power cut may
leave (unsynced data lost, kept, torn or garbage; unsynced directory operations
undone, in any order that keeps operations on one name in order) is loaded by
a fresh saver, which must take the thread over and find the last checkpoint
whose ``put`` returned, or the one in progress, with every pending write whose
``put_writes`` returned.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from _lg_agent import build, question
from langchain_core.runnables import RunnableConfig
from typing_extensions import override

from durably import faults
from durably.langgraph import DurablySaver
from durably.stores import framedlog
from durably.sweep.powerloss import PowerLossFS

IMAGES_PER_POINT = 24
THREAD: RunnableConfig = {"configurable": {"thread_id": "t"}}


class Marking(DurablySaver):
    """A saver that marks in the model's op log where each of its writes begins and returns."""

    def __init__(self, directory: Path, fs: PowerLossFS) -> None:
        super().__init__(directory, fs=fs)
        self.model = fs
        self.events: list[tuple[int, str, tuple[Any, ...]]] = []

    def _event(self, kind: str, what: tuple[Any, ...]) -> None:
        self.model.mark(f"{what[0]} {kind}")
        self.events.append((len(self.model.log), kind, what))

    @override
    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        with self._lock:
            what = ("put", checkpoint["id"])
            self._event("begins", what)
            out = super().put(config, checkpoint, metadata, new_versions)
            self._event("returned", what)
            return out

    @override
    def put_writes(
        self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        with self._lock:
            cid = config["configurable"]["checkpoint_id"]
            what = ("writes", cid, frozenset((task_id, channel) for channel, _ in writes))
            self._event("begins", what)
            super().put_writes(config, writes, task_id, task_path)
            self._event("returned", what)

    @override
    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        with self._lock:
            self._event("begins", ("prune",))
            super().prune(thread_ids, strategy=strategy)
            self._event("returned", ("prune",))


def _expected(events: list[tuple[int, str, tuple[Any, ...]]], point: int) -> tuple[Any, ...]:
    """At ``point``: the acknowledged latest checkpoint, the one in progress, the writes."""
    acknowledged: str | None = None
    running: str | None = None
    writes: dict[str, set[tuple[str, str]]] = {}
    maybe: set[tuple[str, str]] = set()
    for at, kind, what in events:
        if at > point:
            break
        if what[0] == "put":
            if kind == "returned":
                acknowledged, running = what[1], None
            else:
                running = what[1]
        elif what[0] == "writes":
            if kind == "returned":
                writes.setdefault(what[1], set()).update(what[2])
                maybe = set()
            else:
                maybe = set(what[2])
    return acknowledged, running, writes, maybe


def _load(image_root: Path) -> tuple[str | None, set[tuple[str, str]]]:
    with DurablySaver(image_root / "threads") as saver:
        saver._borrow("t")  # noqa: SLF001 -- take the thread over as a restarted writer does (cuts a torn tail)
        found = saver.get_tuple(THREAD)
    if found is None:
        return None, set()
    return found.checkpoint["id"], {(t, c) for t, c, _ in found.pending_writes or []}


@pytest.mark.parametrize("dsync", [True, False], ids=["o_dsync", "write_then_datasync"])
def test_every_power_cut_leaves_the_last_acknowledged_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dsync: bool
) -> None:
    """After a power cut anywhere in a run or a prune, the last acknowledged checkpoint loads
    (with Linux's O_DSYNC append, and with the write + datasync append used elsewhere).
    """
    if not dsync:
        monkeypatch.setattr(framedlog, "DSYNC", 0)
    root = tmp_path / "disk"
    root.mkdir(mode=0o700)
    fs = PowerLossFS(root)
    with faults.installed(faults.CrashPlan(on_point=fs.mark)):
        saver = Marking(root / "threads", fs)
        build(saver, rounds=1).invoke(question(), THREAD, durability="sync")
        assert list((root / "threads").glob("t.1.wlog")), "the run wrote no writes log"
        saver.prune(["t"])
        saver.close()
    assert sum(kind == "returned" and w[0] == "put" for _, kind, w in saver.events) >= 4

    scratch = tmp_path / "images"
    scratch.mkdir()
    checked = points = states = 0
    cache: list[tuple[str, tuple[str | None, set[tuple[str, str]]]]] = []
    for point in range(len(fs.log) + 1):
        if point == 0 or fs.log[point - 1].mutates:
            states += 1
            cache = []
            for n, image in enumerate(fs.images(at=point, limit=IMAGES_PER_POINT)):
                where = image.materialise(scratch / f"{point}-{n}")
                cache.append((image.description, _load(where)))
                shutil.rmtree(where)
        points += 1
        acknowledged, running, writes, maybe = _expected(saver.events, point)
        for description, (latest, pending) in cache:
            context = (
                f"power cut after op {point} ({fs.log[point - 1] if point else '-'}), {description}"
            )
            allowed = {acknowledged, running} if running else {acknowledged}
            assert latest in allowed, f"{context}: found {latest}, wanted one of {allowed}"
            if latest is not None and latest == acknowledged:
                needed = writes.get(latest, set())
                assert needed <= pending, f"{context}: acknowledged writes lost"
                assert pending <= needed | maybe, f"{context}: writes never made appeared"
            checked += 1
    print(f"\n{points} points, {states} distinct states, {checked} disk images judged")
    assert checked > 100
