"""Replaying a recorded run: a model that answers from a JSON file.

The recording format (``format: 1``)::

    {
      "format": 1,
      "model": "claude-sonnet-4-5",          # the model that was recorded
      "price": {"input": 3.0, "output": 15.0},   # dollars per million tokens
      "task": "...",                          # optional: the first user message
      "turns": [
        {"text": "...", "calls": [{"id": "toolu_...", "name": "...", "arguments": "{...}"}],
         "usage": {"input_tokens": 1200, "output_tokens": 180}},
        ...
      ]
    }

Turn n is answered with ``turns[n-1]``. Before answering, the model checks that
the conversation is the recorded one: the task matches, and the request carries
a result for every call of the previous recorded turn. Anything else raises
``ReplayMismatch``, so a recording never answers a conversation it did not see.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from ..errors import ReplayMismatch
from ..state import ToolResult, Usage, UserMessage
from . import Call, CallLog, Fickle, ModelRequest, Price, Reply, ScriptedModel

__all__ = ["RecordedTurn", "Recording", "ReplayModel", "load_recording", "save_recording"]


class RecordedCall(msgspec.Struct, frozen=True, kw_only=True):
    """One recorded tool call."""

    id: str
    name: str
    arguments: str


class RecordedTurn(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One recorded reply."""

    text: str | None = None
    calls: tuple[RecordedCall, ...] = ()
    usage: Usage = Usage()


class RecordedPrice(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Dollars per million tokens."""

    input: float
    output: float
    cache_read: float = 0.0
    cache_write: float = 0.0


class Recording(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A recorded run."""

    format: int = 1
    model: str
    price: RecordedPrice
    task: str | None = None
    turns: list[RecordedTurn] = []


def load_recording(path: str | os.PathLike[str]) -> Recording:
    """Read a recording, with a clear error naming the file when it is not one."""
    try:
        return msgspec.json.decode(Path(path).read_bytes(), type=Recording)
    except (msgspec.DecodeError, OSError) as exc:
        raise ReplayMismatch(path=str(path), turn=0, reason=f"unreadable recording: {exc}") from exc


_loaded: dict[tuple[str, int, int, int], Recording] = {}


def _load_unchanged(path: str | os.PathLike[str]) -> Recording:
    """``load_recording``, decoded once while the file keeps its inode, size and time.

    A replayed run builds its model in every process it starts (the sweep starts
    thousands); a recording is read-only to the model, so one copy serves them all.
    """
    try:
        info = os.stat(path)
    except OSError:
        return load_recording(path)  # which reports the error
    stamp = (os.fspath(path), info.st_ino, info.st_size, info.st_mtime_ns)
    known = _loaded.get(stamp)
    if known is None:
        known = _loaded[stamp] = load_recording(path)
    return known


def save_recording(recording: Recording, path: str | os.PathLike[str]) -> None:
    """Write a recording as indented JSON (it is reviewed like code)."""
    Path(path).write_bytes(msgspec.json.format(msgspec.json.encode(recording), indent=2) + b"\n")


class ReplayModel(ScriptedModel):
    """Plays a recorded run, refusing any conversation that departs from it.

    Args:
        path: the recording.
        log: a call log shared across processes (counts replies paid twice).
        fickle: answer differently when asked again for a turn (for the sweep).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        log: CallLog | str | os.PathLike[str] | None = None,
        fickle: bool | Fickle = False,
    ) -> None:
        self.path = str(path)
        self.recording = _load_unchanged(path)
        price = self.recording.price
        replies = [
            Reply(
                text=turn.text,
                calls=[Call(c.id, c.name, c.arguments) for c in turn.calls],
                usage=turn.usage,
            )
            for turn in self.recording.turns
        ]
        super().__init__(
            replies,
            name=self.recording.model,
            price=Price(
                input=price.input,
                output=price.output,
                cache_read=price.cache_read,
                cache_write=price.cache_write,
            ),
            log=log,
            fickle=fickle,
        )

    async def reply(self, request: ModelRequest) -> Reply:
        """The recorded reply for ``request.turn``, after checking the conversation matches."""
        self._check(request)
        return await super().reply(request)

    def _check(self, request: ModelRequest) -> None:
        turns = self.recording.turns
        turn = request.turn
        if not 1 <= turn <= len(turns):
            raise ReplayMismatch(
                path=self.path, turn=turn, reason=f"the recording has {len(turns)} turns"
            )
        first = next((m for m in request.messages if isinstance(m, UserMessage)), None)
        if (
            self.recording.task is not None
            and request.summary is None
            and (first is None or first.text != self.recording.task)
        ):
            raise ReplayMismatch(path=self.path, turn=turn, reason="the task differs")
        if turn == 1:
            return
        answered = {m.call_id for m in request.messages if isinstance(m, ToolResult)}
        wanted = [c.id for c in turns[turn - 2].calls]
        # A fickle replay answers a repeated turn under new IDs (``<id>-again<n>``).
        missing = [
            call_id
            for call_id in wanted
            if not any(a == call_id or a.startswith(f"{call_id}-again") for a in answered)
        ]
        if missing:
            raise ReplayMismatch(
                path=self.path,
                turn=turn,
                reason=f"no result for recorded call(s) {', '.join(missing)} of turn {turn - 1}",
            )
