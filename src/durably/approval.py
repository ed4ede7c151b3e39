"""Approvers: the person (or policy) the loop asks.

An approver answers two questions:

- ``approve``: may this call run? ``Yes()`` or ``No(reason)`` (the model sees the reason);
- ``resolve``: this call may have acted before a crash and nothing else could
  tell; did it happen? ``Rerun()`` (it did not) or ``Done(result)`` (it did,
  and this is what it returned).

Either may answer ``DEFER``: the run is saved as paused and :meth:`Agent.resume`
takes the answer later through ``decisions=``.
"""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol, TextIO, runtime_checkable

if TYPE_CHECKING:
    import asyncio

from ._values import text_problem
from .errors import ApprovalUnavailable

__all__ = [
    "DEFER",
    "Answer",
    "ApprovalRequest",
    "Approver",
    "Deferred",
    "Done",
    "No",
    "PolicyApprover",
    "Rerun",
    "ResolveRequest",
    "ScriptedApprover",
    "TerminalApprover",
    "Yes",
]


@dataclass(frozen=True)
class Yes:
    """Approve the call."""


@dataclass(frozen=True)
class No:
    """Refuse the call; the model sees the reason as the call's result."""

    reason: str = "refused by the approver"

    def __post_init__(self) -> None:
        if problem := text_problem(self.reason):
            raise TypeError(f"No.reason must be the text the model will see: {problem}")


@dataclass(frozen=True)
class Rerun:
    """The in-doubt call did not happen: run it."""


@dataclass(frozen=True)
class Done:
    """The in-doubt call did happen; ``result`` is what the model will see."""

    result: str

    def __post_init__(self) -> None:
        if problem := text_problem(self.result):
            raise TypeError(f"Done.result must be the text the model will see: {problem}")


class Deferred:
    """The type of :data:`DEFER`: an answer left to a person, given later."""

    def __repr__(self) -> str:
        return "durably.DEFER"


DEFER: Final = Deferred()
"""Answer later: the run pauses and resumes with ``decisions=``."""

Answer = Yes | No | Rerun | Done


@dataclass(frozen=True, kw_only=True)
class ApprovalRequest:
    """A call that needs approval before it runs."""

    run_id: str
    call_id: str
    tool: str
    arguments: str
    effect: str


@dataclass(frozen=True, kw_only=True)
class ResolveRequest:
    """An in-doubt call that neither a rerun nor a lookup could settle."""

    run_id: str
    call_id: str
    tool: str
    arguments: str
    idempotency_key: str
    started_at: str
    why: str
    """Why the ladder could not decide by itself."""


@runtime_checkable
class Approver(Protocol):
    """Answers approval and resolution questions."""

    async def approve(self, request: ApprovalRequest) -> Yes | No | Deferred:
        """May this call run?"""
        ...

    async def resolve(self, request: ResolveRequest) -> Rerun | Done | Deferred:
        """Did this in-doubt call happen?"""
        ...


class PolicyApprover:
    """Approves every call (``--approve off``); defers in-doubt calls to a person.

    A policy cannot know whether a write happened, so it never guesses: the run
    pauses until a person answers: `durably triage --approve on` asks on the terminal,
    and code passes the answer with ``resume(decisions=...)``.
    """

    async def approve(self, request: ApprovalRequest) -> Yes:
        """Say yes."""
        return Yes()

    async def resolve(self, request: ResolveRequest) -> Deferred:
        """Leave it to a person."""
        return DEFER


class ScriptedApprover:
    """Answers from lists, in order, and counts the questions (for tests).

    Args:
        approve: answers to approval questions; when it runs out, ``Yes()``.
        resolve: answers to resolution questions; when it runs out,
            ``ApprovalUnavailable`` is raised (a test should say what it expects).
        log: a file that records every question, shared across processes.
    """

    def __init__(
        self,
        *,
        approve: Sequence[Yes | No] = (),
        resolve: Sequence[Rerun | Done] = (),
        log: str | os.PathLike[str] | None = None,
    ) -> None:
        self._approve = list(approve)
        self._resolve = list(resolve)
        self.log = Path(log) if log is not None else None
        self.approvals: list[ApprovalRequest] = []
        self.resolutions: list[ResolveRequest] = []

    @property
    def questions(self) -> int:
        """Questions asked of this approver in this process."""
        return len(self.approvals) + len(self.resolutions)

    async def approve(self, request: ApprovalRequest) -> Yes | No:
        """The next scripted approval answer."""
        self.approvals.append(request)
        self._record("approve", request.call_id)
        return self._approve.pop(0) if self._approve else Yes()

    async def resolve(self, request: ResolveRequest) -> Rerun | Done:
        """The next scripted resolution answer."""
        self.resolutions.append(request)
        self._record("resolve", request.call_id)
        if not self._resolve:
            raise ApprovalUnavailable(
                run_id=request.run_id, call_id=request.call_id, reason="the script has no answer"
            )
        return self._resolve.pop(0)

    def _record(self, kind: str, call_id: str) -> None:
        if self.log is None:
            return
        with self.log.open("a") as out:
            out.write(json.dumps({"kind": kind, "call_id": call_id}) + "\n")


class TerminalApprover:
    """Asks a person on the terminal (stdin/stdout).

    The answer is read on the event loop (the descriptor is watched, never read
    in a worker thread), so Ctrl-C at the prompt ends the run at once. When no
    person can answer (stdin closed, at its end, unreadable, or absent) it raises
    :class:`~durably.ApprovalUnavailable` and the loop leaves the run paused.
    """

    def __init__(self, *, stdin: TextIO | None = None, stdout: TextIO | None = None) -> None:
        self._in = stdin if stdin is not None else sys.stdin
        self._out = stdout if stdout is not None else sys.stdout
        self._buffer = b""
        """Bytes read past the last answer's line end (a pipe can deliver several lines)."""

    async def approve(self, request: ApprovalRequest) -> Yes | No:
        """Show the call and ask yes or no."""
        text = (
            f"\nApprove {request.tool} ({request.effect})?\n"
            f"{_pretty(request.arguments)}\n[y]es / [n]o: "
        )
        answer = (await self._ask(request.run_id, request.call_id, text)).lower()
        if answer in ("y", "yes"):
            return Yes()
        reason = await self._ask(request.run_id, request.call_id, "Reason for the model: ")
        return No(reason or "refused by the approver")

    async def resolve(self, request: ResolveRequest) -> Rerun | Done:
        """Show the in-doubt call and ask whether it happened."""
        text = (
            f"\nCall {request.call_id} ({request.tool}) may have acted before a crash "
            f"({request.why}).\nKey: {request.idempotency_key}; started {request.started_at}\n"
            f"{_pretty(request.arguments)}\n"
            "Did it happen? [r]erun (it did not) / [d]one (it did): "
        )
        answer = (await self._ask(request.run_id, request.call_id, text)).lower()
        if answer in ("d", "done"):
            result = await self._ask(request.run_id, request.call_id, "What did it return? ")
            return Done(result or "done (confirmed by a person)")
        return Rerun()

    async def _ask(self, run_id: str, call_id: str, prompt: str) -> str:
        def unavailable(reason: str) -> ApprovalUnavailable:
            return ApprovalUnavailable(run_id=run_id, call_id=call_id, reason=reason)

        stream = self._in
        if stream is None or stream.closed:  # None: a process started without stdin
            raise unavailable("stdin is closed")
        try:
            self._out.write(prompt)
            self._out.flush()
            line = await self._read_line(stream)
        except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            raise unavailable(f"the terminal could not be used ({exc})") from exc
        if line is None:
            raise unavailable("no answer on stdin (it is at its end)")
        if text_problem(line):
            raise unavailable("the answer is not text")
        return line.strip()

    async def _read_line(self, stream: TextIO) -> str | None:
        """One line from ``stream``, or None at its end, without blocking the event loop."""
        try:
            fd = stream.fileno()
        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
            return stream.readline() or None  # an in-memory stream answers at once
        import asyncio  # imported where it runs: `import durably` stays light

        encoding = getattr(stream, "encoding", None) or "utf-8"
        loop = asyncio.get_running_loop()
        while b"\n" not in self._buffer:
            readable: asyncio.Future[None] = loop.create_future()
            try:
                loop.add_reader(fd, _wake, readable)
            except (OSError, ValueError, NotImplementedError):
                pass  # a regular file or /dev/null: epoll cannot watch it, and reading never waits
            else:
                try:
                    await readable  # Ctrl-C cancels the run here at once
                finally:
                    loop.remove_reader(fd)
            data = os.read(fd, 4096)
            if not data:
                rest, self._buffer = self._buffer, b""
                return rest.decode(encoding) if rest else None
            self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode(encoding)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _pretty(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except ValueError:
        return arguments
