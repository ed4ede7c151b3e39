"""Recording a run: a model wrapper that writes every reply into a replay file.

:class:`RecordingModel` answers like the model it wraps and, before handing a
reply back, writes it into a recording in the format of
:mod:`durably.models.replay`. A run made against a real provider thereby
becomes a file that :class:`~durably.models.replay.ReplayModel` plays back in a
test, with no network and no key.

What is written: the model's name and price, the task (the first user message),
and per turn the text, the calls (ID, name, raw argument string) and the usage.
Nothing else: no API key, no header, no URL, no provider response. The
recording is rewritten whole (temporary file, then rename) after each reply.

Turn ``n`` is stored at ``turns[n-1]``. Earlier turns are taken from the saved
replies in the request (what the run actually kept), so a turn asked again
after a crash replaces the lost answer, and later turns of a discarded history
are dropped.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

import msgspec

from .._sysio import write_file
from ..errors import ModelError, ReplayMismatch
from ..state import AssistantMessage, ToolCall, Usage, UserMessage
from . import Call, Model, ModelRequest, Reply
from .replay import RecordedCall, RecordedPrice, RecordedTurn, Recording, load_recording

__all__ = ["RecordingModel"]

log = logging.getLogger("durably.models.recorder")

_MILLION = 1_000_000


class RecordingModel:
    """Answers like ``inner`` and records every reply it returns into ``path``.

    The price written into the recording is read off ``inner.dollars`` (the
    cost of a million tokens of each kind), so any :class:`~durably.Model` can
    be recorded.

    Args:
        inner: the model that writes the replies.
        path: the recording; an existing one is carried on (a resumed run).

    Raises:
        ModelError: ``path`` holds a recording of another model.
        ReplayMismatch: ``path`` exists and is not a recording.
    """

    def __init__(self, inner: Model, path: str | os.PathLike[str]) -> None:
        self.inner = inner
        self.path = Path(path)
        if self.path.exists():
            recorded = load_recording(self.path).model
            if recorded != inner.name:
                raise ModelError(
                    provider="recorder",
                    reason=f"{self.path} holds a recording of model {recorded!r}, "
                    f"not {inner.name!r}",
                    remedy="record into another file, or use the model the run was recorded with",
                )

    @property
    def name(self) -> str:
        """The inner model's name (so recording does not change the run's fingerprint)."""
        return self.inner.name

    def dollars(self, usage: Usage) -> float:
        """What ``usage`` costs at the inner model's price."""
        return self.inner.dollars(usage)

    @property
    def max_output_tokens(self) -> int | None:
        """The inner model's output limit, so the loop can bound each call's price."""
        limit = getattr(self.inner, "max_output_tokens", None) or getattr(
            self.inner, "max_tokens", None
        )
        return limit if isinstance(limit, int) else None

    async def reply(self, request: ModelRequest) -> Reply:
        """The inner model's reply, recorded before it is returned.

        A recording that cannot be written is logged and skipped: the run, and the
        reply it has paid for, matter more than the file.
        """
        reply = await self.inner.reply(request)
        try:
            self._record(request, reply)
        except (OSError, ReplayMismatch) as exc:
            log.warning("could not record turn %d into %s: %s", request.turn, self.path, exc)
        return reply

    def _price(self) -> RecordedPrice:
        def per_million(**tokens: int) -> float:
            return self.inner.dollars(Usage(**tokens))

        return RecordedPrice(
            input=per_million(input_tokens=_MILLION),
            output=per_million(output_tokens=_MILLION),
            cache_read=per_million(cache_read_tokens=_MILLION),
            cache_write=per_million(cache_write_tokens=_MILLION),
        )

    def _record(self, request: ModelRequest, reply: Reply) -> None:
        earlier = load_recording(self.path) if self.path.exists() else None
        turns = list(earlier.turns[: request.turn - 1]) if earlier else []
        for message in request.messages:
            if isinstance(message, AssistantMessage) and 1 <= message.turn < request.turn:
                saved = _turn(message.text, message.calls, message.usage)
                index = message.turn - 1
                if index < len(turns):
                    turns[index] = saved
                elif index == len(turns):
                    turns.append(saved)
        if len(turns) != request.turn - 1:
            log.warning(
                "not recording turn %d of run %s into %s: turns before it are missing",
                request.turn,
                request.run_id,
                self.path,
            )
            return
        turns.append(_turn(reply.text, reply.calls, reply.usage))
        task = earlier.task if earlier else None
        if task is None and request.summary is None:
            first = next((m for m in request.messages if isinstance(m, UserMessage)), None)
            task = first.text if first is not None else None
        recording = Recording(model=self.inner.name, price=self._price(), task=task, turns=turns)
        data = msgspec.json.format(msgspec.json.encode(recording), indent=2) + b"\n"
        # Crash-atomic, 0600 (it holds the conversation), never through a planted link.
        write_file(self.path, data, mode=0o600)


def _turn(text: str | None, calls: Iterable[ToolCall | Call], usage: Usage) -> RecordedTurn:
    recorded = tuple(RecordedCall(id=c.id, name=c.name, arguments=c.arguments) for c in calls)
    return RecordedTurn(text=text, calls=recorded, usage=usage)
