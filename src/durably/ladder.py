"""The resolution ladder: how a call found in doubt after a restart is settled.

A call is in doubt when its attempt marker was saved but its result was not: it
may or may not have acted. Each step is tried only if the one before cannot
decide (docs/concepts.md, "The ladder"):

1. rerun when a repeat is harmless: ``read`` or ``idempotent``, or ``keyed``
   while the service still remembers the key;
2. ask the service through the tool's lookup: found (with the result), not
   found (certain), or unknown (an error, a lagging index) which passes it up;
3. ask a person through the approver: rerun, or done with what they found.

This module decides; the loop saves each decision before acting on it.

Each verdict, and each approval answer, is one INFO line on the
``durably.ladder`` logger (:func:`announce`), as the demo prints it::

    in doubt refund c1: ladder step 2 (lookup) -> found

The logger is at INFO by default, so the lines reach whatever handlers the
program configured; a program that configured no logging at all gets them on
stderr (as Python's last resort shows warnings). Silence them with
``logging.getLogger("durably.ladder").setLevel(logging.WARNING)``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Awaitable, Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ._values import describe, exception_text, text_problem
from .approval import DEFER, Approver, Done, Rerun, ResolveRequest
from .errors import ApprovalUnavailable, InvalidValue
from .state import LADDER_STEPS, AttemptMarker, Effect, ToolCall
from .tools import Found, NotFound, Tool, ToolContext, Unknown

__all__ = ["Verdict", "announce", "climb", "key_is_live"]

log = logging.getLogger("durably.ladder")


class _LastResort(logging.Handler):
    """Writes the ladder's lines to stderr while the program has configured no logging.

    Python's own last resort shows warnings only; a verdict is INFO and would be
    lost. Once any handler exists on the way to the root (``basicConfig``,
    pytest's capture, a ``NullHandler``), this one stays quiet and that one decides.
    """

    def emit(self, record: logging.LogRecord) -> None:
        logger: logging.Logger | None = log
        while logger is not None:
            if any(handler is not self for handler in logger.handlers):
                return
            if not logger.propagate:
                break
            logger = logger.parent
        with suppress(OSError, ValueError):  # stderr closed: nowhere to show it
            sys.stderr.write(f"{record.getMessage()}\n")


if log.level == logging.NOTSET:
    log.setLevel(logging.INFO)
log.addHandler(_LastResort())


def announce(kind: str, run_id: str, data: Mapping[str, Any]) -> None:
    """Log one line for a ladder verdict (``ladder``) or an approval (``approved``, ``refused``).

    ``kind`` and ``data`` are the loop's event (:class:`~durably.Event`); other
    kinds log nothing.
    """
    extra = {"run_id": run_id, "call_id": data.get("call_id")}
    if kind == "ladder":
        step = data["step"]
        log.info(
            "in doubt %s %s: ladder step %s (%s) -> %s",
            data["tool"],
            data["call_id"],
            step,
            LADDER_STEPS.get(step, "?"),
            data["outcome"],
            extra=extra,
        )
    elif kind in ("approved", "refused"):
        log.info("approval for %s %s: %s", data["tool"], data["call_id"], kind, extra=extra)


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """What the ladder decided for one in-doubt call."""

    step: int
    """1 = rerun, 2 = lookup, 3 = a person."""
    outcome: str
    """``rerun``, ``found``, ``not-found``, ``done`` or ``deferred``."""
    result: str | None = None
    """The call's result when the ladder found it happened (``found``, ``done``)."""
    detail: str | None = None
    unavailable: str | None = None
    """Why the person could not be asked, when that deferred the call."""

    @property
    def rerun(self) -> bool:
        """True when the call should run (again)."""
        return self.outcome in ("rerun", "not-found")


def key_is_live(tool: Tool, marker: AttemptMarker, now: datetime) -> bool:
    """True while the service still remembers the call's key."""
    if tool.effect is not Effect.KEYED:
        return False
    return tool.key_ttl is None or now - marker.started_at < tool.key_ttl


async def climb(  # noqa: C901 - the ladder's rungs in order (saved, rerun, lookup, key, person): one rule, read in one place
    *,
    call: ToolCall,
    tool: Tool,
    marker: AttemptMarker,
    ctx: ToolContext,
    approver: Approver,
    arguments: dict[str, object],
    before_asking: Callable[[str], Awaitable[None]] | None = None,
) -> Verdict:
    """Walk the ladder for one in-doubt call and return the first step's decision.

    ``before_asking`` is awaited with the reason just before a person is asked
    (step 3), so the loop can save the run as paused with the question first.
    """
    now = ctx.clock()
    extra = {"run_id": ctx.run_id, "call_id": call.id}
    if tool.effect in (Effect.READ, Effect.IDEMPOTENT):
        log.debug("in doubt %s: %s repeats harmlessly, rerun", tool.name, tool.effect, extra=extra)
        return Verdict(step=1, outcome="rerun", detail=f"effect {tool.effect}")
    if key_is_live(tool, marker, now):
        log.debug("in doubt %s: key %s still live, rerun", tool.name, marker.key, extra=extra)
        return Verdict(step=1, outcome="rerun", detail="the service still remembers the key")

    why = "its key expired" if tool.effect is Effect.KEYED else "it writes without a key"
    if tool.lookup is not None:
        try:
            answer = await tool.lookup(ctx, **arguments)
        except Exception as exc:  # noqa: BLE001 - a failing lookup must never decide: pass it up
            failure = exception_text(exc)
            log.warning("lookup for %s raised (%s): unknown", tool.name, failure, extra=extra)
            why = f"{why}, and its lookup failed ({failure})"
        else:
            problem = _lookup_problem(answer)
            if problem is not None:
                # A lookup answering nonsense cannot decide either; the person sees why.
                log.error(
                    "lookup of tool %r for call %r %s: a person decides",
                    tool.name,
                    call.id,
                    problem,
                    extra=extra,
                )
                why = f"{why}, and its lookup {problem}"
            elif isinstance(answer, Found):
                log.debug("in doubt %s: lookup found it", tool.name, extra=extra)
                return Verdict(step=2, outcome="found", result=answer.result)
            elif isinstance(answer, NotFound):
                log.debug(
                    "in doubt %s: lookup says it never happened, rerun", tool.name, extra=extra
                )
                return Verdict(step=2, outcome="not-found")
            else:
                why = f"{why}, and its lookup could not tell"
    else:
        why = f"{why} and has no lookup"

    request = ResolveRequest(
        run_id=ctx.run_id,
        call_id=call.id,
        tool=tool.name,
        arguments=call.arguments,
        idempotency_key=marker.key,
        started_at=marker.started_at.isoformat(),
        why=why,
    )
    log.debug("in doubt %s: asking a person (%s)", tool.name, why, extra=extra)
    if before_asking is not None:
        await before_asking(why)
    try:
        answer3 = await approver.resolve(request)
    except ApprovalUnavailable as exc:  # the question is saved: the run waits for a person
        log.warning("in doubt %s: nobody to ask (%s)", tool.name, exc.reason, extra=extra)
        return Verdict(step=3, outcome="deferred", detail=why, unavailable=exc.reason)
    if answer3 is DEFER:
        return Verdict(step=3, outcome="deferred", detail=why)
    if isinstance(answer3, Done) and text_problem(answer3.result) is None:
        return Verdict(step=3, outcome="done", result=answer3.result, detail=why)
    if isinstance(answer3, Rerun):
        return Verdict(step=3, outcome="rerun", detail=why)
    problem = (
        f"Done.result: {text_problem(answer3.result)}"
        if isinstance(answer3, Done)
        else f"expected Rerun(), Done(result) or DEFER, got {describe(answer3)}"
    )
    raise InvalidValue(
        source=f"approver.resolve for call {call.id!r} of tool {tool.name!r}",
        reason=problem,
        remedy="the run is saved as paused with the question, and asks again when resumed",
    )


def _lookup_problem(answer: object) -> str | None:
    """What is wrong with a lookup's answer, or None when it is one of the three."""
    if isinstance(answer, Found):
        problem = text_problem(answer.result)
        return None if problem is None else f"returned Found with an unusable result: {problem}"
    if isinstance(answer, NotFound | Unknown):
        return None
    return f"returned {describe(answer)}; expected Found(result), NOT_FOUND or UNKNOWN"
