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
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

from ._values import describe, exception_text, text_problem
from .approval import DEFER, Approver, Done, Rerun, ResolveRequest
from .errors import ApprovalUnavailable, InvalidValue
from .state import AttemptMarker, Effect, ToolCall
from .tools import Found, NotFound, Tool, ToolContext, Unknown

__all__ = ["Verdict", "climb", "key_is_live"]

log = logging.getLogger("durably.ladder")


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


async def climb(
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
        log.info("in doubt %s: %s repeats harmlessly, rerun", tool.name, tool.effect, extra=extra)
        return Verdict(step=1, outcome="rerun", detail=f"effect {tool.effect}")
    if key_is_live(tool, marker, now):
        log.info("in doubt %s: key %s still live, rerun", tool.name, marker.key, extra=extra)
        return Verdict(step=1, outcome="rerun", detail="the service still remembers the key")

    why = "its key expired" if tool.effect is Effect.KEYED else "it writes without a key"
    if tool.lookup is not None:
        try:
            answer = await tool.lookup(ctx, **arguments)
        except Exception as exc:  # a failing lookup must never decide: pass it up
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
                log.info("in doubt %s: lookup found it", tool.name, extra=extra)
                return Verdict(step=2, outcome="found", result=answer.result)
            elif isinstance(answer, NotFound):
                log.info(
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
    log.info("in doubt %s: asking a person (%s)", tool.name, why, extra=extra)
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
