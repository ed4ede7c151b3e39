"""A LangGraph thread's on-disk format: its header, its records, and the index they replay to.

A thread is a header (which format, which thread, which generation of log) and framed
logs of :data:`Record` values (:class:`Put`, :class:`Writes`, :class:`Blobs`), msgpack in
:mod:`durably.stores.framedlog`'s frames. Replaying a log (:func:`replay`) builds the
:class:`Index` that reads are answered from. :mod:`._thread` keeps the files.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..errors import CheckpointCorrupt
from ..stores import framedlog
from ..stores.framedlog import payloads

FORMAT = 3
"""Version 3 threads keep pending writes in a log of their own; version 2 (one log) and
version 1 (one log, a header without a checksum) are still read, and written as they are."""
SPLIT_FORMAT = 3
"""The first format with a writes log."""
WRITES_SUFFIX = ".wlog"


Version = str | int | float
Typed = tuple[str, bytes]


# -- records -----------------------------------------------------------------------------


class Header(msgspec.Struct, kw_only=True):
    """A thread's header file: which format, which thread, which generation of log."""

    format: int
    thread_id: str
    generation: int
    crc: int | None = None
    """CRC-32 of ``[format, thread_id, generation]`` as JSON (format 2 on)."""


def header_crc(format: int, thread_id: str, generation: int) -> int:
    """The checksum a header carries (format 2 on)."""
    return zlib.crc32(HEADER_ENCODER.encode([format, thread_id, generation]))


def header(thread_id: str, generation: int) -> bytes:
    """A new header, in today's format, for ``generation`` of ``thread_id``'s log."""
    crc = header_crc(FORMAT, thread_id, generation)
    header = Header(format=FORMAT, thread_id=thread_id, generation=generation, crc=crc)
    return HEADER_ENCODER.encode(header)


class Blob(msgspec.Struct, array_like=True):
    """A channel's value at one version: whole, or the items appended to an earlier value."""

    channel: str
    version: Version
    type: str
    data: bytes
    base: int = 0
    """0 for a whole value; else the seq of the record holding the value this one extends."""


class Put(msgspec.Struct, tag="p", array_like=True):
    """A checkpoint (its channel values are in ``blobs`` and in earlier records)."""

    seq: int
    ns: str
    id: str
    parent: str | None
    checkpoint: Typed
    metadata: Typed
    run_id: str | None
    blobs: list[Blob]


class Writes(msgspec.Struct, tag="w", array_like=True):
    """One task's pending writes for one checkpoint: ``(idx, channel, type, data)`` each."""

    seq: int
    ns: str
    checkpoint_id: str
    task_id: str
    task_path: str
    items: list[tuple[int, str, str, bytes]]


class Blobs(msgspec.Struct, tag="b", array_like=True):
    """Blobs carried by a rewrite, whose checkpoint records may be gone."""

    seq: int
    ns: str
    blobs: list[Blob]


Record = Put | Writes | Blobs

ENCODER = msgspec.msgpack.Encoder()
DECODER = msgspec.msgpack.Decoder(Record)
HEADER_ENCODER = msgspec.json.Encoder()
HEADER_DECODER = msgspec.json.Decoder(Header)


def writes_log_name(key: str, generation: int) -> str:
    """The name of a format 3 thread's writes log for one generation."""
    return f"{key}.{generation}{WRITES_SUFFIX}"


def frame(record: Record) -> bytes:
    """A record framed as every framed log frames its records (magic, length, CRC-32)."""
    return framedlog.frame(ENCODER.encode(record))


# -- the in-memory index -----------------------------------------------------------------


@dataclass(eq=False, slots=True)
class Node:
    """A stored blob; ``base`` is the node it extends (its value is base's value + this one's)."""

    ns: str
    channel: str
    version: Version
    type: str
    data: bytes
    base: Node | None
    seq: int
    order: int


@dataclass
class Index:
    """What a thread's log says, rebuilt by replaying it; reads are answered from here."""

    checkpoints: dict[str, dict[str, Put]] = field(default_factory=dict)
    """namespace -> checkpoint ID -> its record (blobs moved into ``nodes``)."""
    latest: dict[str, str] = field(default_factory=dict)
    """namespace -> its newest checkpoint ID: the greatest, as LangGraph's IDs sort by time
    (kept as records apply, so finding the latest costs nothing however long the thread)."""
    nodes: dict[tuple[str, str, Version], Node] = field(default_factory=dict)
    """(namespace, channel, version) -> the blob last stored under that key."""
    tips: dict[tuple[str, str], Node] = field(default_factory=dict)
    """(namespace, channel) -> the blob last stored for that channel."""
    writes: dict[tuple[str, str], dict[tuple[str, int], tuple[str, str, str, bytes, str]]] = field(
        default_factory=dict
    )
    """(namespace, checkpoint ID) -> (task ID, idx) -> (task ID, channel, type, data, task path)."""
    seq: int = 0
    wseq: int = 0
    """The last record of the writes log (format 3); 0 before its first."""
    _by_seq: dict[tuple[int, str, str], Node] = field(default_factory=dict)
    _order: int = 0

    def apply(self, record: Record, *, path: str = "") -> None:
        """Apply one record (its seq must follow the last one's)."""
        if record.seq != self.seq + 1:
            raise CheckpointCorrupt(path=path, reason=f"record {record.seq} follows {self.seq}")
        if isinstance(record, Writes):
            self._add_writes(record)
        else:
            for blob in record.blobs:
                self._add_node(record.seq, record.ns, blob, path=path)
            if isinstance(record, Put):
                record.blobs = []
                self.checkpoints.setdefault(record.ns, {})[record.id] = record
                if record.id > self.latest.get(record.ns, ""):
                    self.latest[record.ns] = record.id
        self.seq = record.seq

    def apply_writes(self, record: Record, *, path: str = "") -> None:
        """Apply one record of the writes log (its seq must follow that log's last one)."""
        if not isinstance(record, Writes):
            raise CheckpointCorrupt(
                path=path, reason=f"record {record.seq} of a writes log is not a task's writes"
            )
        if record.seq != self.wseq + 1:
            raise CheckpointCorrupt(
                path=path, reason=f"writes record {record.seq} follows {self.wseq}"
            )
        self._add_writes(record)
        self.wseq = record.seq

    def _add_writes(self, record: Writes) -> None:
        slot = self.writes.setdefault((record.ns, record.checkpoint_id), {})
        for idx, channel, type_, data in record.items:
            slot[(record.task_id, idx)] = (record.task_id, channel, type_, data, record.task_path)

    def _add_node(self, seq: int, ns: str, blob: Blob, *, path: str) -> None:
        base = None
        if blob.base:
            base = self._by_seq.get((blob.base, ns, blob.channel))
            if base is None:
                raise CheckpointCorrupt(
                    path=path,
                    reason=f"record {seq} extends channel {blob.channel!r} of record "
                    f"{blob.base}, which holds no such value",
                )
        self._order += 1
        node = Node(ns, blob.channel, blob.version, blob.type, blob.data, base, seq, self._order)
        self.nodes[(ns, blob.channel, blob.version)] = node
        self.tips[(ns, blob.channel)] = node
        self._by_seq[(seq, ns, blob.channel)] = node

    def rewritten(
        self, *, keep: set[tuple[str, str]] | None, versions: dict[tuple[str, str], Any], start: int
    ) -> list[Record]:
        """Records that rebuild this index with only the ``keep`` checkpoints (None: all).

        ``versions`` maps each kept (namespace, ID) to its checkpoint's channel
        versions (decoded by the caller, which holds the serializer). Blobs come
        first, in the order they were first stored, so that a value appears
        before anything extending it; seqs start at ``start``.
        """
        kept = [
            record
            for ns, by_id in self.checkpoints.items()
            for cid, record in by_id.items()
            if keep is None or (ns, cid) in keep
        ]
        kept.sort(key=lambda record: record.seq)
        live: dict[int, Node] = {}
        for record in kept:
            for channel, version in versions[(record.ns, record.id)].items():
                node: Node | None = self.nodes.get((record.ns, channel, version))
                while node is not None and node.order not in live:
                    live[node.order] = node
                    node = node.base
        out: list[Record] = []
        seq = start - 1
        new_seq: dict[int, int] = {}
        for order in sorted(live):
            node = live[order]
            seq += 1
            new_seq[order] = seq
            base = new_seq[node.base.order] if node.base is not None else 0
            blob = Blob(node.channel, node.version, node.type, node.data, base)
            out.append(Blobs(seq=seq, ns=node.ns, blobs=[blob]))
        for record in kept:
            seq += 1
            out.append(msgspec.structs.replace(record, seq=seq, blobs=[]))
        for (ns, cid), slot in self.writes.items():
            if keep is not None and (ns, cid) not in keep:
                continue
            by_task: dict[tuple[str, str], list[tuple[int, str, str, bytes]]] = {}
            for (task_id, idx), (_, channel, type_, data, task_path) in slot.items():
                by_task.setdefault((task_id, task_path), []).append((idx, channel, type_, data))
            for (task_id, task_path), items in by_task.items():
                seq += 1
                out.append(Writes(seq, ns, cid, task_id, task_path, items))
        return out


def records(data: bytes, *, path: str) -> Iterator[tuple[Record, int]]:
    """The log's valid records, each with the offset just after it.

    A record that is short or fails its checksum with no valid record after it is
    a torn tail (never acknowledged) and ends the log; with a valid record after
    it, the log is ``CheckpointCorrupt``.
    """
    for payload, start, end in payloads(data, path=path):
        try:
            record = DECODER.decode(payload)
        except msgspec.DecodeError as exc:
            raise CheckpointCorrupt(path=path, reason=f"record at byte {start}: {exc}") from exc
        yield record, end


def replay(data: bytes, *, path: str) -> tuple[Index, int]:
    """The index a log's valid records build, and the length of those records."""
    index = Index()
    valid = 0
    for record, end in records(data, path=path):
        index.apply(record, path=path)
        valid = end
    return index, valid


def replay_writes(index: Index, data: bytes, *, path: str) -> int:
    """Apply a writes log's valid records to ``index``; the length of those records."""
    valid = 0
    for record, end in records(data, path=path):
        index.apply_writes(record, path=path)
        valid = end
    return valid


def value_chain(node: Node) -> Iterator[Node]:
    """The nodes whose values, concatenated in order, make ``node``'s value."""
    chain = []
    current: Node | None = node
    while current is not None:
        chain.append(current)
        current = current.base
    return reversed(chain)
