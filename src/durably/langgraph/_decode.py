"""A file thread's values read back: each one through the allowlist, then the tuple.

:func:`loads` is ``serde.loads_typed`` refusing a value that names a type outside the
allowlist (:class:`ThreadValueRefused`) or a type tag the saver does not read;
:func:`checkpoint_tuple` builds LangGraph's ``CheckpointTuple`` from a thread's index.
"""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.base import CheckpointTuple, writes_sort_key
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.event_hooks import SerdeEvent

from ..errors import CheckpointCorrupt
from ._records import Index, Node, Put, value_chain
from ._refusals import ThreadValueRefused, refusals_in_read

__all__ = ["checkpoint_tuple", "loads", "node_value"]


def loads(
    serde: SerializerProtocol, directory: str, thread_id: str, typed: tuple[str, bytes]
) -> Any:
    """``serde.loads_typed``, refusing a value that names a type outside the allowlist."""
    refusals: list[SerdeEvent] = []
    token = refusals_in_read.set(refusals)
    try:
        value = serde.loads_typed(typed)
    except NotImplementedError as exc:  # a type tag it does not read ("pickle")
        raise CheckpointCorrupt(
            path=f"{directory} (thread {thread_id!r})",
            reason=f"a value is stored as {typed[0]!r}, which this saver does not read",
        ) from exc
    finally:
        refusals_in_read.reset(token)
    if refusals:
        first = refusals[0]
        raise ThreadValueRefused(
            thread_id=thread_id,
            directory=directory,
            module=first["module"],
            name=first["name"],
        )
    return value


def node_value(serde: SerializerProtocol, directory: str, thread_id: str, node: Node) -> Any:
    """The value of ``node``: its chain of parts (a base and the appends on it) decoded."""
    value: Any = None
    for part in value_chain(node):
        decoded = loads(serde, directory, thread_id, (part.type, part.data))
        value = decoded if part.base is None else value + decoded
    return value


def checkpoint_tuple(
    serde: SerializerProtocol, directory: str, thread_id: str, index: Index, record: Put
) -> CheckpointTuple:
    """``record`` as LangGraph reads it: the checkpoint, its channel values, its writes."""
    ns = record.ns
    checkpoint = loads(serde, directory, thread_id, record.checkpoint)
    values: dict[str, Any] = {}
    for channel, version in checkpoint.get("channel_versions", {}).items():
        node = index.nodes.get((ns, channel, version))
        if node is None or node.type == "empty":
            continue
        values[channel] = node_value(serde, directory, thread_id, node)
    checkpoint["channel_values"] = values
    stored = index.writes.get((ns, record.id), {})
    ordered = sorted(stored.items(), key=lambda kv: writes_sort_key(kv[1][4], *kv[0]))
    pending = [
        (task_id, channel, loads(serde, directory, thread_id, (type_, data)))
        for _, (task_id, channel, type_, data, _path) in ordered
    ]
    parent = (
        {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": record.parent,
            }
        }
        if record.parent
        else None
    )
    return CheckpointTuple(
        config={
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": record.id,
            }
        },
        checkpoint=checkpoint,
        metadata=loads(serde, directory, thread_id, record.metadata),
        parent_config=parent,  # type: ignore[arg-type]
        pending_writes=pending,
    )
