"""``DurablySaver``: a LangGraph checkpointer on durably's journal files.

The synchronous methods are the core (LangGraph's sync graphs call them from
worker threads); the async ones run them in a worker thread when the saver
syncs to disk, as durably's stores do. One lock serializes every call, with
one exception: a ``put_writes`` on a format 3 thread flushes its record to the
writes log without holding it, so that the step's ``put`` (LangGraph starts it
while the step's writes are still being saved) need not wait for that flush;
the flushed record is queued on the handle and applied to its index by the
next holder of the lock that reads the index (``ThreadLog.index``). While it
flushes, it holds the handle's ``flushing`` lock: a second ``put_writes`` on the
thread waits (one append at a time per log), and whatever closes or rewrites
the handle waits first (:meth:`DurablySaver._quiesce`, :meth:`DurablySaver.release`).
Those waits hold the saver's lock, which the flush in progress never needs again.

Each ``put`` and ``put_writes`` does all of its work (encoding, the lock check,
the index) before its durable write and nothing after it but a return: the
write lets LangGraph's main thread take the GIL, and whatever the saver's thread
did after it would first wait to get the GIL back (design.md, LangGraph saver).
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from .. import faults
from .._sysio import FileSystem
from ..stores.rundir import off_the_loop
from ._common import SaverForms
from ._decode import checkpoint_tuple, loads, node_value
from ._records import Blob, Index, Node, Put, Writes, frame
from ._refusals import StaleThread, ThreadValueRefused
from ._thread import ThreadLog, ThreadStore

__all__ = ["PRUNE_STRATEGIES", "DurablySaver", "StaleThread", "ThreadValueRefused"]

_T = TypeVar("_T")


PRUNE_STRATEGIES = ("keep_latest", "delete")
"""The strategies :meth:`DurablySaver.prune` accepts (LangGraph's names)."""


class DurablySaver(SaverForms):
    """A LangGraph checkpointer that keeps each thread as durably's append-only journal.

    Every ``put`` and ``put_writes`` is one append and one ``fdatasync`` holding
    only what changed: the channels in ``new_versions``, and for a list channel
    that grew (``messages`` under ``add_messages``) only the appended items.
    The first write to a thread takes its lock, held until :meth:`close` (or
    :meth:`release`); another process writing the same thread gets
    :class:`ThreadLocked` at once. Reading needs no lock.

    Args:
        directory: where the threads' files live; created (0700) if missing.
        sync: flush every write to stable storage before returning. Turn off only
            where power loss does not matter (a killed process still loses nothing).
        serde: LangGraph's serializer for values. By default a ``JsonPlusSerializer``
            that builds only the types on LangGraph's safe list (LangChain's messages and
            documents, LangGraph's ``Send``/``Command``/``Interrupt``, ``datetime``,
            ``uuid``, ``decimal``, sets, ``deque``, paths...) and those in
            ``allowed_types``: a value naming any other callable is refused on read
            (:class:`ThreadValueRefused`), never imported or called.
        allowed_types: more types the default serializer may build, as classes or
            ``(module, name)`` pairs: the application's own state types (dataclasses,
            pydantic models, enums). Not with ``serde`` (give that one its allowlist).
        fs: the system-call seam (tests inject faults or the power-loss model here).
        allow_network_fs: use a network file system anyway, where ``flock`` may not
            exclude a process on another machine.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        sync: bool = True,
        serde: SerializerProtocol | None = None,
        allowed_types: Iterable[tuple[str, str] | type] = (),
        fs: FileSystem | None = None,
        allow_network_fs: bool = False,
    ) -> None:
        allowed = tuple(allowed_types)
        if serde is not None and allowed:
            raise ValueError(
                "give allowed_types to the serializer you pass as serde "
                "(JsonPlusSerializer(allowed_msgpack_modules=...)), not to DurablySaver"
            )
        # LangGraph's own default builds any callable a record names (os.system too);
        # None is its strict mode: only the safe list, plus what the application allows.
        super().__init__(serde=serde or JsonPlusSerializer(allowed_msgpack_modules=allowed or None))
        self.store = ThreadStore(directory, sync=sync, fs=fs, allow_network_fs=allow_network_fs)
        self._directory = str(self.store.directory)
        """Where the threads live, as errors name it."""
        self._owned: dict[str, ThreadLog] = {}
        self._lock = threading.RLock()
        # Per (thread, namespace): the checkpoints this saver took for the latest (read
        # without a checkpoint_id, or saved by it on one of those). A put on one of them
        # that is no longer the latest was built on a stale read (StaleThread); one
        # addressed by id leaves the set, so forking it on purpose is a put like any other.
        self._seen_latest: dict[tuple[str, str], set[str | None]] = {}

    # -- lifetime ----------------------------------------------------------------------

    def close(self) -> None:
        """Release every thread this saver writes, and the directory."""
        with self._lock:
            for thread_id in list(self._owned):
                self.release(thread_id)
            self._seen_latest.clear()
            self.store.close_sync()

    def claim(self, thread_id: str) -> None:
        """Take the thread's lock now, before the graph reads it or runs a node.

        Raises :class:`ThreadLocked` at once if another process is writing the thread.
        A saver otherwise takes the lock at its first write, which on a resume
        (``invoke(None)``) comes after the first node has run: two processes resuming
        the same thread would both run it. Claim first, then invoke; the lock is held
        until :meth:`release` or :meth:`close`. Claiming a thread this saver already
        writes does nothing.
        """
        with self._lock:
            self._ready(thread_id)

    def release(self, thread_id: str) -> None:
        """Stop writing a thread: its lock is freed for another process.

        Waits for a ``put_writes`` flushing to the thread's writes log to finish.
        """
        with self._lock:
            handle = self._owned.pop(thread_id, None)
            if handle is not None:
                handle.wait_idle()
                handle.close_sync()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- writing -----------------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint: durable when this returns (see the class docstring)."""
        configurable = config["configurable"]
        thread_id: str = configurable["thread_id"]
        ns: str = configurable.get("checkpoint_ns", "")
        values = checkpoint["channel_values"]
        header = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        full_metadata = get_checkpoint_metadata(config, metadata)
        run_id = full_metadata.get("run_id")
        # Encoded before taking the saver's lock: a put often arrives while the step's
        # put_writes is still being flushed, and this work needs nothing it guards.
        encoded_checkpoint = self.serde.dumps_typed(header)
        encoded_metadata = self.serde.dumps_typed(full_metadata)
        saved: RunnableConfig = {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }
        parent: str | None = configurable.get("checkpoint_id")
        with self._lock:
            handle = self._ready(thread_id)
            try:
                self._refuse_stale(handle, ns, parent)
                blobs: list[Blob] = []
                lists: dict[tuple[str, str], list[Any] | None] = {}
                for channel, version in new_versions.items():
                    if channel not in values:
                        blobs.append(Blob(channel, version, "empty", b""))
                        lists[(ns, channel)] = None
                        continue
                    value = values[channel]
                    base = self._extends(handle, ns, channel, value)
                    if base is not None:
                        node, length = base
                        type_, data = self.serde.dumps_typed(value[length:])
                        blobs.append(Blob(channel, version, type_, data, node.seq))
                    else:
                        type_, data = self.serde.dumps_typed(value)
                        blobs.append(Blob(channel, version, type_, data))
                    lists[(ns, channel)] = list(value) if isinstance(value, list) else None
                record = Put(
                    seq=handle.index.seq + 1,
                    ns=ns,
                    id=checkpoint["id"],
                    parent=parent,
                    checkpoint=encoded_checkpoint,
                    metadata=encoded_metadata,
                    run_id=run_id if isinstance(run_id, str) else None,
                    blobs=blobs,
                )
                # Everything but the write is done first (the index too): once the write
                # returns, only a return is left for after the GIL is won back.
                handle.append(record, lists=lists)
                seen = self._seen_latest.get((thread_id, ns))
                if seen is not None and parent in seen:
                    seen.add(checkpoint["id"])  # a chain begun on a read goes on being checked
                faults.point("langgraph.put.saved")
            except BaseException:
                # The disk may hold more than the index now (a flushed append whose reply
                # was an error): the next write claims the thread again and reads the disk.
                self.release(thread_id)
                raise
        return saved

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes for a checkpoint (a write already stored is kept)."""
        configurable = config["configurable"]
        thread_id: str = configurable["thread_id"]
        ns: str = configurable.get("checkpoint_ns", "")
        checkpoint_id: str = configurable["checkpoint_id"]
        encoded = [
            (WRITES_IDX_MAP.get(channel, position), channel, *self.serde.dumps_typed(value))
            for position, (channel, value) in enumerate(writes)
        ]  # before the lock, as in put
        with self._lock:
            handle = self._ready(thread_id)
            # One append at a time per log; the one in progress needs no lock to finish.
            handle.flushing.acquire()
            try:
                staged = self._stage_writes(handle, ns, checkpoint_id, task_id, task_path, encoded)
            except BaseException:
                handle.flushing.release()
                self.release(thread_id)
                raise
            if staged is None:
                handle.flushing.release()
                return
        self._flush_writes(handle, *staged)

    def _stage_writes(  # noqa: PLR0917 - private, one caller: the writes of one put_writes
        self,
        handle: ThreadLog,
        ns: str,
        checkpoint_id: str,
        task_id: str,
        task_path: str,
        encoded: list[tuple[int, str, str, bytes]],
    ) -> tuple[Writes, bytes] | None:
        """A task's writes record, framed, to append without the saver's lock; or None.

        None when there was nothing to store, or when it was stored here, under the
        lock: on a new thread, a format 2 one, or the first writes since the claim
        (which open the writes log). Called with the handle's ``flushing`` held.
        """
        stored = handle.index.writes.get((ns, checkpoint_id), {})
        # As LangGraph's own savers do: a regular write (idx >= 0) is never replaced.
        items = [item for item in encoded if item[0] < 0 or (task_id, item[0]) not in stored]
        if not items:
            return None
        if not (handle.exists and handle.split and handle.writes_log_open):
            handle.append(
                Writes(handle.index.seq + 1, ns, checkpoint_id, task_id, task_path, items)
            )
            faults.point("langgraph.writes.saved")
            return None
        handle.claim.check_usable()
        record = Writes(handle.index.wseq + 1, ns, checkpoint_id, task_id, task_path, items)
        return record, frame(record)

    def _flush_writes(self, handle: ThreadLog, record: Writes, framed: bytes) -> None:
        """Append a writes record without the saver's lock, then queue it and let go of the log.

        Called holding the handle's ``flushing``, which :meth:`ThreadLog.flushed` (or
        :meth:`ThreadLog.break_off`) releases; nothing here takes the saver's lock
        before that, since holders of the lock wait for it (see the module docstring).
        """
        try:
            handle.append_writes_unlocked(framed)
        except BaseException as exc:
            handle.break_off(f"a write failed ({exc.__class__.__name__})")
            with self._lock:
                error = handle.writes_failed(exc) if isinstance(exc, OSError) else None
                if self._owned.get(handle.thread_id) is handle:
                    self.release(handle.thread_id)
            if error is not None:
                raise error from exc
            raise
        handle.flushed(record)
        faults.point("langgraph.writes.saved")

    def delete_thread(self, thread_id: str) -> None:
        """Delete a thread's checkpoints and writes (its lock file stays, as lock files do)."""
        with self._lock:
            self._quiesce()
            handle = self._borrow(thread_id)
            try:
                if handle.exists:
                    handle.delete()
            finally:
                self.release(thread_id)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) whose metadata names one of ``run_ids``."""
        wanted = set(run_ids)
        if not wanted:
            return
        with self._lock:
            self._quiesce()
            for thread_id in self.store.thread_ids():
                index = self._index(thread_id)
                if index is None or not any(
                    record.run_id in wanted
                    for by_id in index.checkpoints.values()
                    for record in by_id.values()
                ):
                    continue
                owned = thread_id in self._owned
                handle = self._borrow(thread_id)
                try:
                    keep = {
                        (ns, cid)
                        for ns, by_id in handle.index.checkpoints.items()
                        for cid, record in by_id.items()
                        if record.run_id not in wanted
                    }
                    self._rewrite(handle, keep)
                finally:
                    if not owned:
                        self.release(thread_id)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of one thread into another (added to what it has)."""
        with self._lock:
            self._quiesce()
            source = self._index(source_thread_id)
            if source is None or not source.checkpoints:
                return
            owned = target_thread_id in self._owned
            handle = self._borrow(target_thread_id)
            try:
                records = handle.index.rewritten(
                    keep=None,
                    versions=self._versions(target_thread_id, handle.index, None),
                    start=1,
                )
                records += source.rewritten(
                    keep=None,
                    versions=self._versions(source_thread_id, source, None),
                    start=len(records) + 1,
                )
                self._guarded(handle, lambda: handle.rewrite(records))
            finally:
                if not owned:
                    self.release(target_thread_id)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Keep each namespace's latest checkpoint (``keep_latest``) or nothing (``delete``)."""
        if strategy not in PRUNE_STRATEGIES:
            known = ", ".join(PRUNE_STRATEGIES)
            raise ValueError(f"prune strategy {strategy!r} is not known; use one of {known}")
        with self._lock:
            self._quiesce()
            for thread_id in thread_ids:
                if strategy == "delete":
                    self.delete_thread(thread_id)
                    continue
                if self._index(thread_id) is None:
                    continue
                owned = thread_id in self._owned
                handle = self._borrow(thread_id)
                try:
                    keep = set(handle.index.latest.items())
                    self._rewrite(handle, keep)
                finally:
                    if not owned:
                        self.release(thread_id)

    def get_next_version(self, current: str | None, channel: None) -> str:
        """The next version of a channel: a counter (zero-padded, so strings sort) and a nonce.

        The nonce keeps two branches of a thread (a fork from an old checkpoint)
        from writing different values under the same version.
        """
        if current is None:
            number = 0
        elif isinstance(current, int | float):
            number = int(current)
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:010d}.{secrets.token_hex(4)}"

    # -- reading -----------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names, or the thread's latest in its namespace."""
        configurable = config["configurable"]
        thread_id: str = configurable["thread_id"]
        ns: str = configurable.get("checkpoint_ns", "")
        checkpoint_id = get_checkpoint_id(config)
        with self._lock:
            index = self._index(thread_id)
            by_id = index.checkpoints.get(ns) if index is not None else None
            latest = index.latest.get(ns) if index is not None else None
            seen = self._seen_latest.setdefault((thread_id, ns), set())
            if checkpoint_id is not None:
                seen.discard(checkpoint_id)  # addressed by id: a put on it forks on purpose
            else:
                checkpoint_id = latest
                seen.add(latest)
            if index is None or not by_id or checkpoint_id is None:
                return None
            record = by_id.get(checkpoint_id)
            if record is None:
                return None
            return checkpoint_tuple(self.serde, self._directory, thread_id, index, record)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints matching the criteria, newest first within each thread."""
        with self._lock:
            found = list(self._matching(config, filter=filter, before=before, limit=limit))
        yield from found

    # -- internals ---------------------------------------------------------------------

    async def _off_loop(self, function: Callable[..., _T], *arguments: Any) -> _T:
        return await off_the_loop(self.store.sync, function, *arguments)

    def _ready(self, thread_id: str) -> ThreadLog:
        """The owned thread, claimed if need be (under the lock)."""
        handle = self._owned.get(thread_id)
        if handle is None:
            handle = self._owned[thread_id] = self.store.claim_sync(thread_id)
        return handle

    def _refuse_stale(self, handle: ThreadLog, ns: str, parent: str | None) -> None:
        """Raise :class:`StaleThread` if a put on ``parent`` would fork the chain unasked."""
        latest = handle.index.latest.get(ns) if handle.exists else None
        if latest is None:
            return
        if parent != latest and parent in self._seen_latest.get((handle.thread_id, ns), ()):
            raise StaleThread(thread_id=handle.thread_id, ns=ns, parent=parent, latest=latest)

    def _quiesce(self) -> None:
        """Wait (under the lock) until no put_writes is flushing without it.

        Called first by whatever closes, rewrites or deletes handles: once it
        returns, and while the lock is held, no put_writes starts flushing.
        """
        for handle in list(self._owned.values()):
            handle.wait_idle()

    def _borrow(self, thread_id: str) -> ThreadLog:
        if thread_id not in self._owned:
            self._owned[thread_id] = self.store.claim_sync(thread_id)
        return self._owned[thread_id]

    def _guarded(self, handle: ThreadLog, action: Callable[[], None]) -> None:
        try:
            action()
        except BaseException:
            self.release(handle.thread_id)
            raise

    def _rewrite(self, handle: ThreadLog, keep: set[tuple[str, str]]) -> None:
        if not keep:
            self._guarded(handle, handle.delete)
            return
        records = handle.index.rewritten(
            keep=keep, versions=self._versions(handle.thread_id, handle.index, keep), start=1
        )
        self._guarded(handle, lambda: handle.rewrite(records))

    def _versions(
        self, thread_id: str, index: Index, keep: set[tuple[str, str]] | None
    ) -> dict[tuple[str, str], Any]:
        return {
            (ns, cid): loads(self.serde, self._directory, thread_id, record.checkpoint).get(
                "channel_versions", {}
            )
            for ns, by_id in index.checkpoints.items()
            for cid, record in by_id.items()
            if keep is None or (ns, cid) in keep
        }

    def _index(self, thread_id: str) -> Index | None:
        handle = self._owned.get(thread_id)
        if handle is not None:
            return handle.index if handle.exists else None
        return self.store.read_index(thread_id)

    def _extends(
        self, handle: ThreadLog, ns: str, channel: str, value: Any
    ) -> tuple[Node, int] | None:
        """The stored blob ``value`` extends (and its length), when it is a longer list."""
        if not isinstance(value, list) or not value:
            return None
        tip = handle.index.tips.get((ns, channel))
        if tip is None or tip.type == "empty":
            return None
        known = handle.previous.get((ns, channel))
        if known is None or known[0] is not tip:
            previous = node_value(self.serde, self._directory, handle.thread_id, tip)
            if not isinstance(previous, list):
                return None
            known = (tip, previous)
            handle.previous[(ns, channel)] = known
        previous = known[1]
        length = len(previous)
        if length == 0 or length > len(value) or value[:length] != previous:
            return None
        return tip, length

    def _matching(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> Iterator[CheckpointTuple]:
        if config is not None:
            thread_ids = [config["configurable"]["thread_id"]]
            want_ns = config["configurable"].get("checkpoint_ns")
            want_id = get_checkpoint_id(config)
        else:
            thread_ids, want_ns, want_id = self.store.thread_ids(), None, None
        before_id = get_checkpoint_id(before) if before is not None else None
        left = limit
        for thread_id in thread_ids:
            index = self._index(thread_id)
            if index is None:
                continue
            records = sorted(
                (
                    record
                    for ns, by_id in index.checkpoints.items()
                    if want_ns is None or ns == want_ns
                    for record in by_id.values()
                ),
                key=lambda record: record.id,
                reverse=True,
            )
            for record in records:
                if want_id is not None and record.id != want_id:
                    continue
                if before_id is not None and record.id >= before_id:
                    continue
                if filter:
                    metadata = loads(self.serde, self._directory, thread_id, record.metadata)
                    if not all(metadata.get(k) == v for k, v in filter.items()):
                        continue
                if left is not None:
                    if left <= 0:
                        return
                    left -= 1
                yield checkpoint_tuple(self.serde, self._directory, thread_id, index, record)
