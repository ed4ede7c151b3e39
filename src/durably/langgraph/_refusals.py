"""What the savers refuse, and the errors that say so: an unknown type in a value, a stale put.

LangGraph's strict serializer only logs a type it refuses to load; the listener here
collects those refusals into :data:`refusals_in_read` during a saver's read, so the read
raises :class:`ThreadValueRefused` instead of returning the value's arguments.
"""

from __future__ import annotations

import contextvars

from langgraph.checkpoint.serde.event_hooks import SerdeEvent, register_serde_event_listener

from ..errors import StorageError

__all__ = ["StaleThread", "ThreadValueRefused", "refusals_in_read"]


class ThreadValueRefused(StorageError):
    """Raised when a thread's value names a type the saver does not load; nothing of it ran.

    Allow the type with ``DurablySaver(..., allowed_types=[...])`` (or, on Postgres, a
    ``serde`` whose allowlist holds it) if the graph stores it; otherwise the thread's
    stored values were altered.
    """

    __module__ = "durably.langgraph"

    def __init__(self, *, thread_id: str, directory: str, module: str, name: str) -> None:
        self.thread_id = thread_id
        self.directory = directory
        self.module = module
        self.name = name
        super().__init__(
            f"thread {thread_id!r} in {directory} holds a value naming {module}.{name}, which "
            "this saver does not load (it is not in its allowlist), so it was neither "
            "imported nor called; if your graph stores that type, allow it: "
            f"DurablySaver(..., allowed_types=[({module!r}, {name!r})]), or give "
            "PostgresThreadSaver a serde whose allowlist holds it; if it does not, the "
            "thread's stored values were altered: inspect them"
        )


class StaleThread(StorageError):
    """Raised by a ``put`` built on a checkpoint the thread has moved past; nothing was written.

    The saver read the thread's latest checkpoint, another writer then saved a newer
    one, and this put would have made a second child of the old one: a fork nobody
    asked for. Claim the thread before reading it (:meth:`DurablySaver.claim`), or
    address the old checkpoint by its ``checkpoint_id`` to fork it on purpose.
    """

    __module__ = "durably.langgraph"

    def __init__(self, *, thread_id: str, ns: str, parent: str | None, latest: str) -> None:
        self.thread_id = thread_id
        self.ns = ns
        self.parent = parent
        self.latest = latest
        where = f"thread {thread_id!r}" + (f" (namespace {ns!r})" if ns else "")
        read = f"checkpoint {parent}" if parent is not None else "no checkpoint"
        super().__init__(
            f"{where} moved on since this saver read it: it read {read} as the latest, and "
            f"another writer has since saved {latest}; this put, built on the old read, "
            "was refused so the checkpoint chain does not fork, and nothing was written; "
            "claim the thread before reading it (saver.claim(thread_id), see "
            "docs/langgraph.md) and run again, or address the old checkpoint by its "
            "checkpoint_id to fork it on purpose"
        )


refusals_in_read: contextvars.ContextVar[list[SerdeEvent] | None] = contextvars.ContextVar(
    "durably_langgraph_refusals", default=None
)
"""The serializer's refusals during the saver's current read, in this thread (else None)."""


def _note_refusal(event: SerdeEvent) -> None:
    """Keep one refusal of the serializer for the read under way, if any."""
    # LangGraph's strict serializer returns a refused value's arguments in its place and
    # only logs: the saver turns any refusal during its read into an error.
    seen = refusals_in_read.get()
    if seen is not None and event["kind"] in ("msgpack_blocked", "msgpack_method_blocked"):
        seen.append(event)


register_serde_event_listener(_note_refusal)
