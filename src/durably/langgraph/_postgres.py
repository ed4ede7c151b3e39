"""``PostgresThreadSaver``: a LangGraph checkpointer for fleets, on durably's Postgres schema.

One writer per thread across machines: a thread's lease is its row of
``durably_lg_threads`` (owner, fencing token, expiry by the database's clock).
Claiming takes it only if it is free or expired, bumping the token; a daemon
thread renews the leases this saver holds. Every write is one autocommitted
statement that locks the thread's row ``FOR SHARE`` on the condition that the
token is still this saver's and the lease unexpired, and inserts only from that
row: a write of an owner whose lease was taken over inserts nothing
(:class:`~durably.errors.LeaseLost`), decided by the database; a takeover waits
for a write in flight and then refuses every later one.

A ``put`` built on a checkpoint the thread has moved past is refused in the same
statement (:class:`StaleThread`), as :class:`DurablySaver` refuses it. Channel
values are stored as :class:`DurablySaver` stores them: a list channel that grew
is saved as the appended items and the version it extends, so each step writes
what changed, not the whole state. The tables are migration 5 of
:mod:`durably.postgres.schema`.
"""

from __future__ import annotations

import asyncio
import builtins
import contextvars
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from .. import faults
from ..errors import LeaseLost
from ..postgres._lease import default_owner
from ._common import SaverForms
from ._decode import loads
from ._pg_sql import (
    BLOBS,
    CLAIM,
    COPY_THREAD,
    DELETE_FOR_RUNS,
    DELETE_THREAD,
    GET,
    KEEP_LATEST,
    PUT,
    PUT_NEW,
    PUT_WRITES,
    PUT_WRITES_KEPT,
    PUT_WRITES_NEW,
    RELEASE,
    RENEW,
    WRITES,
    migrate_schema,
)
from ._refusals import StaleThread
from ._saver import PRUNE_STRATEGIES, DurablySaver
from ._thread import ThreadLocked

if TYPE_CHECKING:
    from psycopg import Connection
    from psycopg_pool import ConnectionPool

__all__ = ["PostgresThreadSaver"]

log = logging.getLogger("durably.store")

_T = TypeVar("_T")


class PostgresThreadSaver(SaverForms):
    """A LangGraph checkpointer in PostgreSQL with one writer per thread across machines.

    The fleet form of :class:`DurablySaver`: the same ``claim``/``release``, the
    same :class:`StaleThread` refusal of a put built on an old read, the same
    deltas (a list channel that grew is stored as its new items). A thread is
    claimed (its lease taken) at the first write, or by :meth:`claim` before the
    graph runs; another process claiming it gets :class:`ThreadLocked` until the
    lease is released or expires. A write after this saver's lease was taken over
    is refused by the database: :class:`~durably.errors.LeaseLost`, nothing written.

    Args:
        dsn: a libpq connection string or URL; tables are created (migrated) in the
            first schema of its ``search_path``, alongside ``PostgresStore``'s.
        lease: how long a lease lasts without renewal; a process stalled for longer
            loses its threads to others.
        renew_every: how often the held leases are renewed (default: a third of ``lease``).
        owner: names this process in the lease (default: host, PID and a random tag).
        serde: LangGraph's serializer (default: the strict ``JsonPlusSerializer``, as
            :class:`DurablySaver`'s).
        pool_size: the most connections the saver opens.
    """

    def __init__(
        self,
        dsn: str,
        *,
        lease: timedelta = timedelta(seconds=15),
        renew_every: timedelta | None = None,
        owner: str | None = None,
        serde: SerializerProtocol | None = None,
        pool_size: int = 4,
    ) -> None:
        if lease <= timedelta(0):
            raise ValueError(f"lease must be positive, got {lease}")
        renew_every = renew_every if renew_every is not None else lease / 3
        if not timedelta(0) < renew_every < lease:
            raise ValueError(f"renew_every ({renew_every}) must be shorter than lease ({lease})")
        super().__init__(serde=serde or JsonPlusSerializer(allowed_msgpack_modules=None))
        from psycopg.conninfo import conninfo_to_dict

        self.dsn = dsn
        self.lease = lease
        self.renew_every = renew_every
        self.owner = owner or default_owner()
        params = conninfo_to_dict(dsn)
        host = params.get("host") or "localhost"
        port = f":{params['port']}" if params.get("port") else ""
        self.where = f"postgresql://{host}{port}/{params.get('dbname', '')}"
        self._pool_size = pool_size
        self._pool: ConnectionPool[Connection[tuple[Any, ...]]] | None = None
        self._lock = threading.RLock()
        self._tokens: dict[str, int] = {}
        """The threads this saver holds, with their fencing tokens."""
        self._lost: set[str] = set()
        """Held threads whose renewal found the lease gone: writes raise LeaseLost."""
        self._tips: dict[tuple[str, str, str], tuple[str, list[Any]]] = {}
        """Per (thread, ns, channel): the version and list value this saver last stored."""
        self._seen_latest: dict[tuple[str, str], set[str | None]] = {}
        """As DurablySaver's: checkpoints read as the latest (see DurablySaver)."""
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    # -- lifetime ----------------------------------------------------------------------

    def setup(self) -> None:
        """Open the pool and migrate the schema (done by the first call otherwise)."""
        self._connections()

    def _connections(self) -> ConnectionPool[Connection[tuple[Any, ...]]]:
        pool = self._pool
        if pool is not None:
            return pool
        with self._lock:
            if self._pool is None:
                from psycopg import Connection
                from psycopg_pool import ConnectionPool

                migrate_schema(self.dsn, self.where)
                opened: ConnectionPool[Connection[tuple[Any, ...]]] = ConnectionPool(
                    self.dsn,
                    connection_class=Connection,
                    kwargs={"autocommit": True, "application_name": "durably-langgraph"},
                    min_size=1,
                    max_size=self._pool_size,
                    open=False,
                    name="durably-langgraph",
                )
                opened.open(wait=True, timeout=self.lease.total_seconds())
                self._pool = opened
            return self._pool

    def _execute(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        with self._connections().connection() as conn:
            cursor = conn.execute(sql, params, prepare=True)
            return cursor.fetchall() if cursor.description is not None else []

    def _insert(self, first: str, again: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """Send ``first`` (plain inserts); if a row it inserts is there already, ``again``.

        A unique violation aborts the whole statement, so nothing of ``first`` is kept.
        """
        from psycopg.errors import UniqueViolation

        try:
            return self._execute(first, params)
        except UniqueViolation:
            if first == again:
                raise
            return self._execute(again, params)

    def close(self) -> None:
        """Release every thread this saver holds, stop renewing, close the pool."""
        with self._lock:
            for thread_id in list(self._tokens):
                self.release(thread_id)
            self._seen_latest.clear()
            self._stop.set()
            renewer, self._renewer = self._renewer, None
            pool, self._pool = self._pool, None
        if renewer is not None:
            renewer.join()
        if pool is not None:
            pool.close()

    def claim(self, thread_id: str) -> None:
        """Take the thread's lease now, before the graph reads it or runs a node.

        Raises :class:`ThreadLocked` at once if another process holds it. Claim
        first, then invoke: a resume (``invoke(None)``) otherwise runs its first node
        before its first write claims. Held until :meth:`release` or :meth:`close`;
        claiming a thread this saver holds does nothing.
        """
        if not isinstance(thread_id, str) or not thread_id:
            raise ValueError(f"thread_id must be a non-empty string, not {thread_id!r}")
        with self._lock:
            if thread_id in self._tokens and thread_id not in self._lost:
                return
            rows = self._execute(
                CLAIM, {"thread_id": thread_id, "owner": self.owner, "lease": self.lease}
            )
            if not rows:
                raise ThreadLocked(thread_id=thread_id, path=self._describe(thread_id))
            self._tokens[thread_id] = int(rows[0][0])
            self._lost.discard(thread_id)
            for key in [k for k in self._tips if k[0] == thread_id]:
                del self._tips[key]  # another owner may have written since
            self._start_renewing()

    def release(self, thread_id: str) -> None:
        """Stop writing a thread: its lease is freed for another process at once."""
        with self._lock:
            token = self._tokens.pop(thread_id, None)
            self._lost.discard(thread_id)
            if token is not None and self._pool is not None:
                self._execute(RELEASE, {"thread_id": thread_id, "token": token})

    def token(self, thread_id: str) -> int | None:
        """The fencing token of the thread's lease this saver holds, or None."""
        return self._tokens.get(thread_id)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self._off_loop(self.close)

    def _start_renewing(self) -> None:
        if self._renewer is None:
            self._stop.clear()
            self._renewer = threading.Thread(
                target=self._renew_loop, name="durably-langgraph-renew", daemon=True
            )
            self._renewer.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.renew_every.total_seconds()):
            with self._lock:
                held = {t: n for t, n in self._tokens.items() if t not in self._lost}
            if not held:
                continue
            try:
                rows = self._execute(
                    RENEW,
                    {
                        "lease": self.lease,
                        "thread_ids": list(held),
                        "tokens": list(held.values()),
                    },
                )
            except Exception as exc:  # noqa: BLE001 - the database's fence refuses a lapsed lease anyway
                log.info("renewing LangGraph thread leases: %s; trying again", exc)
                continue
            renewed = {str(row[0]) for row in rows}
            with self._lock:
                self._lost.update(t for t in held if t not in renewed and t in self._tokens)

    def _loads(self, thread_id: str, typed: tuple[str, bytes]) -> Any:
        """A stored value decoded, refused if it names a type outside the allowlist."""
        return loads(self.serde, self.where, thread_id, typed)

    def _describe(self, thread_id: str) -> str:
        return f"{self.where} durably_lg_threads[{thread_id!r}]"

    def _held(self, thread_id: str) -> int:
        """The thread's token, claimed at the first write; LeaseLost once it was lost."""
        with self._lock:
            if thread_id in self._lost:
                raise LeaseLost(run_id=thread_id, token=self._tokens[thread_id])
            if thread_id not in self._tokens:
                self.claim(thread_id)
            return self._tokens[thread_id]

    def _fenced(self, thread_id: str, token: int) -> LeaseLost:
        with self._lock:
            if self._tokens.get(thread_id) == token:
                self._lost.add(thread_id)
        return LeaseLost(run_id=thread_id, token=token)

    # -- writing -----------------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint and its changed channels: committed when this returns."""
        configurable = config["configurable"]
        thread_id: str = configurable["thread_id"]
        ns: str = configurable.get("checkpoint_ns", "")
        parent: str | None = configurable.get("checkpoint_id")
        values = checkpoint["channel_values"]
        header = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        full_metadata = get_checkpoint_metadata(config, metadata)
        run_id = full_metadata.get("run_id")
        type_, data = self.serde.dumps_typed(header)
        meta_type, meta = self.serde.dumps_typed(full_metadata)
        token = self._held(thread_id)
        channels: list[str] = []
        versions: list[str] = []
        types: list[str] = []
        datas: list[bytes] = []
        bases: list[str | None] = []
        tips: dict[tuple[str, str, str], tuple[str, list[Any]]] = {}
        for channel, version in new_versions.items():
            channels.append(channel)
            versions.append(str(version))
            if channel not in values:
                types.append("empty")
                datas.append(b"")
                bases.append(None)
                continue
            value = values[channel]
            tip = self._tips.get((thread_id, ns, channel))
            if (
                isinstance(value, list)
                and tip is not None
                and 0 < len(tip[1]) <= len(value)
                and value[: len(tip[1])] == tip[1]
            ):
                blob_type, blob = self.serde.dumps_typed(value[len(tip[1]) :])
                bases.append(tip[0])
            else:
                blob_type, blob = self.serde.dumps_typed(value)
                bases.append(None)
            types.append(blob_type)
            datas.append(blob)
            if isinstance(value, list):
                tips[(thread_id, ns, channel)] = (str(version), list(value))
        seen = self._seen_latest.get((thread_id, ns))
        check = seen is not None and parent in seen
        rows = self._insert(
            PUT_NEW,
            PUT,
            {
                "thread_id": thread_id,
                "token": token,
                "ns": ns,
                "id": checkpoint["id"],
                "parent": parent,
                "check": check,
                "run_id": run_id if isinstance(run_id, str) else None,
                "type": type_,
                "checkpoint": data,
                "meta_type": meta_type,
                "metadata": meta,
                "channels": channels,
                "versions": versions,
                "types": types,
                "datas": datas,
                "bases": bases,
            },
        )
        fenced, accepted, latest = rows[0]
        if not fenced:
            raise self._fenced(thread_id, token)
        if not accepted:
            raise StaleThread(thread_id=thread_id, ns=ns, parent=parent, latest=str(latest))
        with self._lock:
            for key, known in tips.items():
                self._tips[key] = known
            for channel in channels:
                if (thread_id, ns, channel) not in tips:
                    self._tips.pop((thread_id, ns, channel), None)
            if seen is not None and parent in seen:
                seen.add(checkpoint["id"])
        faults.point("langgraph.put.saved")
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes for a checkpoint (a regular write stored is kept)."""
        configurable = config["configurable"]
        thread_id: str = configurable["thread_id"]
        encoded = [
            (WRITES_IDX_MAP.get(channel, position), channel, *self.serde.dumps_typed(value))
            for position, (channel, value) in enumerate(writes)
        ]
        if not encoded:
            return
        token = self._held(thread_id)
        special = all(item[0] < 0 for item in encoded)
        rows = self._insert(
            PUT_WRITES if special else PUT_WRITES_NEW,
            PUT_WRITES if special else PUT_WRITES_KEPT,
            {
                "thread_id": thread_id,
                "token": token,
                "ns": configurable.get("checkpoint_ns", ""),
                "checkpoint_id": configurable["checkpoint_id"],
                "task_id": task_id,
                "task_path": task_path,
                "idxs": [item[0] for item in encoded],
                "channels": [item[1] for item in encoded],
                "types": [item[2] for item in encoded],
                "datas": [item[3] for item in encoded],
            },
        )
        if not rows[0][0]:
            raise self._fenced(thread_id, token)
        faults.point("langgraph.writes.saved")

    def delete_thread(self, thread_id: str) -> None:
        """Delete a thread's checkpoints, values and writes (its lease row stays)."""
        with self._connections().connection() as conn, conn.transaction():
            for statement in DELETE_THREAD:
                conn.execute(statement, {"t": thread_id})
        with self._lock:
            for key in [k for k in self._tips if k[0] == thread_id]:
                del self._tips[key]

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) whose metadata names one of ``run_ids``."""
        if not run_ids:
            return
        with self._connections().connection() as conn, conn.transaction():
            conn.execute(DELETE_FOR_RUNS, {"r": list(run_ids)})

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, value and write of one thread into another."""
        params = {"s": source_thread_id, "t": target_thread_id}
        with self._connections().connection() as conn, conn.transaction():
            for statement in COPY_THREAD:
                conn.execute(statement, params)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Keep each namespace's latest checkpoint (``keep_latest``) or nothing (``delete``)."""
        if strategy not in PRUNE_STRATEGIES:
            known = ", ".join(PRUNE_STRATEGIES)
            raise ValueError(f"prune strategy {strategy!r} is not known; use one of {known}")
        if strategy == "delete":
            for thread_id in thread_ids:
                self.delete_thread(thread_id)
            return
        with self._connections().connection() as conn, conn.transaction():
            conn.execute(KEEP_LATEST, {"t": list(thread_ids)})

    get_next_version = DurablySaver.get_next_version

    # -- reading -----------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names, or the thread's latest in its namespace."""
        configurable = config["configurable"]
        thread_id: str = configurable["thread_id"]
        ns: str = configurable.get("checkpoint_ns", "")
        checkpoint_id = get_checkpoint_id(config)
        params: dict[str, Any] = {"thread_id": thread_id, "ns": ns}
        if checkpoint_id is not None:
            rows = self._execute(
                GET + " AND checkpoint_id = %(id)s", {**params, "id": checkpoint_id}
            )
        else:
            rows = self._execute(GET + " ORDER BY checkpoint_id DESC LIMIT 1", params)
        with self._lock:
            seen = self._seen_latest.setdefault((thread_id, ns), set())
            if checkpoint_id is not None:
                seen.discard(checkpoint_id)  # addressed by id: a put on it forks on purpose
            elif not rows:
                seen.add(None)
            else:
                seen.add(str(rows[0][1]))
        if not rows:
            return None
        return self._tuple(thread_id, rows[0])

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints matching the criteria, newest first within each thread."""
        where: list[str] = []
        params: dict[str, Any] = {}
        if config is not None:
            where.append("thread_id = %(thread_id)s")
            params["thread_id"] = config["configurable"]["thread_id"]
            if config["configurable"].get("checkpoint_ns") is not None:
                where.append("ns = %(ns)s")
                params["ns"] = config["configurable"]["checkpoint_ns"]
            if (wanted := get_checkpoint_id(config)) is not None:
                where.append("checkpoint_id = %(id)s")
                params["id"] = wanted
        if before is not None and (before_id := get_checkpoint_id(before)) is not None:
            where.append("checkpoint_id < %(before)s")
            params["before"] = before_id
        sql = (
            "SELECT thread_id, ns, checkpoint_id, parent_id, type, checkpoint, meta_type, metadata "
            "FROM durably_lg_checkpoints"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY thread_id, checkpoint_id DESC"
        )
        rows = self._execute(sql, params)
        found: list[CheckpointTuple] = []
        for row in rows:
            if limit is not None and len(found) >= limit:
                break
            if filter:
                meta = self._loads(str(row[0]), (row[6], bytes(row[7])))
                if not all(meta.get(k) == v for k, v in filter.items()):
                    continue
            found.append(self._tuple(str(row[0]), row[1:]))
        yield from found

    def thread_ids(self) -> builtins.list[str]:
        """Every thread with a checkpoint, sorted."""
        rows = self._execute(
            "SELECT DISTINCT thread_id FROM durably_lg_checkpoints ORDER BY thread_id", {}
        )
        return [str(row[0]) for row in rows]

    def _tuple(self, thread_id: str, row: Sequence[Any]) -> CheckpointTuple:
        ns, checkpoint_id, parent_id, type_, data, meta_type, meta = row
        checkpoint = self._loads(thread_id, (type_, bytes(data)))
        versions = checkpoint.get("channel_versions", {})
        params = {
            "thread_id": thread_id,
            "ns": ns,
            "channels": list(versions),
            "versions": [str(v) for v in versions.values()],
        }
        values: dict[str, Any] = {}
        for channel, blob_type, blob, _depth in self._execute(BLOBS, params):
            if blob_type == "empty":
                values.pop(channel, None)
                continue
            decoded = self._loads(thread_id, (blob_type, bytes(blob)))
            if channel in values and isinstance(values[channel], list):
                values[channel] = values[channel] + decoded
            else:
                values[channel] = decoded
        checkpoint["channel_values"] = values
        writes = self._execute(
            WRITES, {"thread_id": thread_id, "ns": ns, "checkpoint_id": checkpoint_id}
        )
        ordered = sorted(writes, key=lambda w: writes_sort_key(w[5], w[0], w[1]))
        pending = [
            (str(task_id), str(channel), self._loads(thread_id, (wtype, bytes(wdata))))
            for task_id, _idx, channel, wtype, wdata, _path in ordered
        ]
        return CheckpointTuple(
            config={
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": ns,
                    "checkpoint_id": checkpoint_id,
                }
            },
            checkpoint=checkpoint,
            metadata=self._loads(thread_id, (meta_type, bytes(meta))),
            parent_config=(
                {
                    "configurable": {
                        "thread_id": thread_id,
                        "checkpoint_ns": ns,
                        "checkpoint_id": parent_id,
                    }
                }
                if parent_id
                else None
            ),
            pending_writes=pending,
        )

    async def _off_loop(self, function: Callable[..., _T], *arguments: Any) -> _T:
        context = contextvars.copy_context()
        return await asyncio.to_thread(context.run, function, *arguments)
