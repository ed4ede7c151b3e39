"""What LangGraph's two durably savers share: the context manager and the async forms.

Both savers' synchronous methods are the core; every async form runs its sync
method off the event loop through the saver's own :meth:`_off_loop` (the file
saver only when it syncs to disk, the Postgres one always). Each saver keeps
what differs: ``close``, ``claim``, ``release``, ``__aexit__`` and ``_off_loop``.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)

__all__ = ["SaverForms"]

_T = TypeVar("_T")


class SaverForms(BaseCheckpointSaver[str], abc.ABC):
    """The context manager and the async forms over a saver's synchronous methods."""

    @abc.abstractmethod
    def close(self) -> None:
        """Let go of every thread this saver holds and of its resources."""

    @abc.abstractmethod
    def claim(self, thread_id: str) -> None:
        """Take ``thread_id`` for this saver's writes, or raise if another writer holds it."""

    @abc.abstractmethod
    async def _off_loop(self, function: Callable[..., _T], *arguments: Any) -> _T:
        """Run ``function(*arguments)`` off the event loop, as this saver's storage allows."""

    # -- lifetime ----------------------------------------------------------------------

    async def aclaim(self, thread_id: str) -> None:
        """Async form of :meth:`claim`."""
        await self._off_loop(self.claim, thread_id)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    # -- async forms -------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async form of :meth:`get_tuple`."""
        return await self._off_loop(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Async form of :meth:`list`."""

        def collect() -> list[CheckpointTuple]:
            return list(self.list(config, filter=filter, before=before, limit=limit))

        for found in await self._off_loop(collect):
            yield found

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Async form of :meth:`put`."""
        return await self._off_loop(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Async form of :meth:`put_writes`."""
        await self._off_loop(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """Async form of :meth:`delete_thread`."""
        await self._off_loop(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Async form of :meth:`delete_for_runs`."""
        await self._off_loop(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Async form of :meth:`copy_thread`."""
        await self._off_loop(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Async form of :meth:`prune`."""

        def run() -> None:
            self.prune(thread_ids, strategy=strategy)

        await self._off_loop(run)
