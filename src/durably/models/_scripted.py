"""A model scripted in code, and the log that counts its calls across processes.

:class:`ScriptedModel` answers turn n with the n-th reply of a list; a :class:`CallLog`
records every call it answers, which is how tests count replies paid twice.
``durably.models`` re-exports every name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import msgspec

from .._sysio import append_line
from ..errors import ModelError
from ..state import Usage
from ._seam import ModelRequest, Price, Reply, usage_problem

__all__ = ["CallLog", "Fickle", "ScriptedModel"]


class _Asked(msgspec.Struct):
    """One line of a :class:`CallLog`."""

    run_id: str
    turn: int


_ASKED_LINES = msgspec.json.Decoder(_Asked)


class CallLog:
    """An append-only log of model calls, one JSON line per call, shared by processes.

    Each line is written with one ``write`` on an ``O_APPEND`` descriptor, so it
    survives the process being killed right after (the page cache keeps it); a
    symlink planted at the path is refused, never followed.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def append(self, run_id: str, turn: int) -> None:
        """Record that the model was asked for ``turn`` of ``run_id``."""
        line = json.dumps({"run_id": run_id, "turn": turn}) + "\n"
        append_line(self.path, line.encode())  # O_APPEND|O_NOFOLLOW, one write

    def turns(self, run_id: str | None = None) -> list[int]:
        """Every turn asked for, in order (of one run, or of all)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        # One decode for all lines: the crash sweep reads the log several times a scenario.
        entries = _ASKED_LINES.decode_lines(data)
        return [e.turn for e in entries if run_id is None or e.run_id == run_id]

    def paid_twice(self, run_id: str | None = None) -> int:
        """How many calls asked again for a turn already asked for."""
        turns = self.turns(run_id)
        return len(turns) - len(set(turns))


Fickle = Callable[[Reply, int], Reply]


def _new_call_ids(reply: Reply, attempt: int) -> Reply:
    """The default fickleness: the same calls under new call IDs."""
    calls = [replace(call, id=f"{call.id}-again{attempt}") for call in reply.calls]
    return replace(reply, calls=calls)


class ScriptedModel:
    """A model that answers turn n with the n-th reply of a list.

    Args:
        replies: the reply for each turn, in order.
        name: the model name recorded in the fingerprint.
        price: dollars per million tokens.
        log: a :class:`CallLog` (or its path) recording every call, across processes.
        fickle: when asked again for a turn it already answered (according to the
            log), answer differently: ``True`` gives the same calls new IDs; a
            function ``(reply, attempt) -> reply`` gives anything else.
    """

    def __init__(
        self,
        replies: Sequence[Reply],
        *,
        name: str = "scripted",
        price: Price | None = None,
        log: CallLog | str | os.PathLike[str] | None = None,
        fickle: bool | Fickle = False,
    ) -> None:
        self._replies = list(replies)
        self._name = name
        self._price = price or Price(input=3.0, output=15.0)
        self.log = log if isinstance(log, CallLog) or log is None else CallLog(log)
        self._fickle: Fickle | None = (
            _new_call_ids if fickle is True else (fickle if callable(fickle) else None)
        )
        self.calls: list[int] = []
        """Turns asked for by this process, in order."""

    @property
    def name(self) -> str:
        """The model name recorded in the fingerprint."""
        return self._name

    def dollars(self, usage: Usage) -> float:
        """What ``usage`` costs at this model's price."""
        return self._price.dollars(usage)

    def usage_bound(self, request: ModelRequest) -> Usage:
        """Exactly what the scripted reply for ``request.turn`` uses: the script knows."""
        if 1 <= request.turn <= len(self._replies):
            usage = self._replies[request.turn - 1].usage
            if isinstance(usage, Usage) and usage_problem(usage) is None:
                return usage
        # No such turn (reply() refuses it without a cost), or a scripted usage that
        # checked_reply will refuse with a clearer message than a bound could give.
        return Usage()

    async def reply(self, request: ModelRequest) -> Reply:
        """The scripted reply for ``request.turn``."""
        turn = request.turn
        if not 1 <= turn <= len(self._replies):
            raise ModelError(
                provider="scripted",
                reason=f"the script has {len(self._replies)} replies and turn {turn} was asked for",
                remedy="add replies to the script or lower max_turns",
            )
        earlier = self.log.turns(request.run_id).count(turn) if self.log else self.calls.count(turn)
        self.calls.append(turn)
        if self.log is not None:
            self.log.append(request.run_id, turn)
        reply = self._replies[turn - 1]
        if earlier and self._fickle is not None:
            reply = self._fickle(reply, earlier)
        return replace(reply, model=reply.model or self._name)
