"""A run session's side of the tool calls: approval, the attempt marker, the ladder, the result.

:class:`RunSession` is :class:`~durably.engine.core.SessionCore` with the calls of
a saved reply: :meth:`RunSession.settle` answers one (a saved result, an approval,
the ladder for a call in doubt, or a run under a marker with its derived key).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from .. import faults, ladder
from ..approval import DEFER, ApprovalRequest, No, Yes
from ..errors import ApprovalUnavailable, InvalidValue
from ..keys import idempotency_key
from ..state import (
    Approval,
    ApprovalKind,
    AttemptMarker,
    Decision,
    Effect,
    Phase,
    Resolution,
    ResolutionOutcome,
    ToolCall,
)
from ..tools import KeyNotSent, Tool, ToolContext, ToolInDoubt, ToolResultError
from ..workspace import sha256_bytes
from .core import SessionCore
from .records import SavePoint, answer_problem, approver_name, error_text

__all__ = ["RunSession"]

log = logging.getLogger("durably.loop")  # the engine's lines keep the loop's logger name


class RunSession(SessionCore):
    """One process's hold on one run: every save, marker, key and ladder step of it.

    A front end opens a session on a run's handle and its loaded state, then
    drives it: :meth:`count_restart` (and :meth:`check_agent`,
    :meth:`check_workspace`) on every open for resume; :meth:`check_limits` and
    :meth:`mark_model_call` before each model call; :meth:`save_reply` when the
    reply arrives; :meth:`settle` for each of the reply's :meth:`open_calls`. A
    call's tool runs through the ``run`` callable given to :meth:`settle`, so a
    framework that runs tools itself hands its own handler in.

    Args:
        handle: owns the run; every save goes through it.
        state: the run's state as last saved (or as just created).
        limits: turn, token, dollar and resume limits over the run's life.
        approver: answers approval and in-doubt questions.
        clock: the time source for markers and key ages.
        workspace: the directory tools write files through, if any.
        observer: called with every :class:`Event`.
        history: folds old history into a summary as results land.
    """

    # -- one call ------------------------------------------------------------------------

    async def settle(
        self,
        call: ToolCall,
        tool: Tool,
        arguments: dict[str, Any],
        *,
        run: Callable[[ToolContext], Awaitable[str]] | None = None,
    ) -> bool:
        """Answer one call of the saved reply; False when the run must pause.

        A call with a marker goes up the ladder; a call needing approval asks
        first; anything else runs (marker first unless it only reads) through
        ``run`` (default: the tool itself with ``arguments``), and its result is saved.
        """
        state = self.state
        marker = state.markers.get(call.id)
        if marker is not None:
            return await self.resolve_in_doubt(call, tool, marker, arguments, run=run)

        if tool.needs_approval:
            decision = state.decisions.get(call.id)
            if decision is None:
                answer = await self.ask_approval(call, tool)
                if answer is None:
                    return False
                decision = answer
            if not decision.approved:
                await self.finish(call, f"refused by the approver: {decision.reason}", True)
                return True
        return await self.execute(call, tool, arguments, previous=None, run=run)

    async def ask_approval(self, call: ToolCall, tool: Tool) -> Decision | None:
        """Ask the approver about ``call`` (the question saved first); None to pause."""
        state = self.state
        if call.id not in state.pending:
            state.pending[call.id] = Approval(
                call_id=call.id,
                tool=tool.name,
                arguments=call.arguments,
                asked_at=self.clock(),
            )
            state.phase = Phase.PAUSED
            await self.save(SavePoint.PAUSE)  # save point 5: waiting for a person
        self.emit("approval", call_id=call.id, tool=tool.name)
        try:
            answer = await self.approver.approve(
                ApprovalRequest(
                    run_id=state.run_id,
                    call_id=call.id,
                    tool=tool.name,
                    arguments=call.arguments,
                    effect=str(tool.effect),
                )
            )
        except ApprovalUnavailable as exc:
            # The question is saved (the pause above): the run waits for a person.
            self.emit("unavailable", call_id=call.id, tool=tool.name, reason=exc.reason)
            return None
        if answer is DEFER:
            return None
        problem = answer_problem(answer, (Yes, No))
        if problem or not isinstance(answer, Yes | No):
            raise InvalidValue(
                source=f"approver.approve for call {call.id!r} of tool {tool.name!r}",
                reason=problem or "",
                remedy="answer Yes(), No(reason) or DEFER; the run is saved as paused and "
                "asks again when resumed",
            )
        decision = Decision(
            approved=isinstance(answer, Yes),
            reason=answer.reason if isinstance(answer, No) else None,
            decided_at=self.clock(),
            by=approver_name(self.approver),
        )
        # Kept in memory only: it is saved with the attempt marker (yes) or the result (no),
        # so a crash in between asks again and leaves nothing to resolve.
        state.decisions[call.id] = state.approvals_given[call.id] = decision
        state.pending.pop(call.id, None)
        state.phase = Phase.TOOLS
        self.emit("approved" if decision.approved else "refused", call_id=call.id, tool=tool.name)
        return decision

    async def resolve_in_doubt(
        self,
        call: ToolCall,
        tool: Tool,
        marker: AttemptMarker,
        arguments: dict[str, Any],
        *,
        run: Callable[[ToolContext], Awaitable[str]] | None = None,
        said: str | None = None,
    ) -> bool:
        """Settle a call that may have acted through the ladder; False when it must pause.

        ``said``: what the tool's ``ToolInDoubt`` said, when this process heard it.
        """
        verdict = await self.judge_in_doubt(call, tool, marker, arguments, said=said)
        return await self.act_on_verdict(call, tool, marker, arguments, verdict, run=run)

    async def judge_in_doubt(
        self,
        call: ToolCall,
        tool: Tool,
        marker: AttemptMarker,
        arguments: dict[str, Any],
        *,
        said: str | None = None,
    ) -> ladder.Verdict:
        """Climb the ladder for an in-doubt call without acting on the verdict.

        A ``deferred`` verdict has its question saved (save point 5); any other is for
        :meth:`act_on_verdict`, in this process (nothing of it is saved yet). A front end
        whose framework asks "may this call run?" before running it (the Agents SDK's
        ``needs_approval``) judges there and acts when the framework runs the call.
        """
        state = self.state

        async def before_asking(why: str) -> None:
            # Save point 5, as for approvals: the call now waits for a person, so a crash or
            # an unreachable approver leaves the run paused with the question on disk.
            if call.id not in state.pending:
                state.pending[call.id] = Approval(
                    call_id=call.id,
                    tool=tool.name,
                    arguments=call.arguments,
                    asked_at=self.clock(),
                    kind=ApprovalKind.RESOLVE,
                    # The tool's own words (the person's best clue) travel with the question.
                    why=why if said is None else f"{why}; the tool said: {said}",
                )
                state.phase = Phase.PAUSED
                await self.save(SavePoint.PAUSE)

        verdict = await ladder.climb(
            call=call,
            tool=tool,
            marker=marker,
            ctx=self.context(call, marker.intended),
            approver=self.approver,
            arguments=arguments,
            before_asking=before_asking,
        )
        if verdict.unavailable is not None:
            self.emit("unavailable", call_id=call.id, tool=tool.name, reason=verdict.unavailable)
        self.emit(
            "ladder", call_id=call.id, tool=tool.name, step=verdict.step, outcome=verdict.outcome
        )
        return verdict

    async def act_on_verdict(
        self,
        call: ToolCall,
        tool: Tool,
        marker: AttemptMarker,
        arguments: dict[str, Any],
        verdict: ladder.Verdict,
        *,
        run: Callable[[ToolContext], Awaitable[str]] | None = None,
    ) -> bool:
        """Act on :meth:`judge_in_doubt`'s verdict; False when it waits for a person.

        The found result is saved, or the call runs again under its first marker.
        """
        state = self.state
        if verdict.outcome == "deferred":
            return False  # the question was saved by before_asking
        state.pending.pop(call.id, None)
        if state.phase is Phase.PAUSED and not state.pending:
            state.phase = Phase.TOOLS
        state.resolutions[call.id] = Resolution(
            step=verdict.step,
            outcome=ResolutionOutcome(verdict.outcome),
            detail=verdict.detail,
            by=approver_name(self.approver) if verdict.step == 3 else None,
        )
        if verdict.result is not None:
            await self.finish(call, verdict.result, False)
            return True
        return await self.execute(call, tool, arguments, previous=marker, run=run)

    async def execute(
        self,
        call: ToolCall,
        tool: Tool,
        arguments: dict[str, Any],
        *,
        previous: AttemptMarker | None,
        run: Callable[[ToolContext], Awaitable[str]] | None = None,
    ) -> bool:
        """Run one call (marker first, unless it only reads); False when the run must pause."""
        state = self.state
        intended: dict[str, str] = {}
        if tool.effect is not Effect.READ:
            if previous is not None:
                # Keep the first attempt's time (the service's key age counts from it)
                # and its intended hashes (the file may already hold them).
                marker = previous
            else:
                try:
                    files = await tool.intended_files(self.context(call), **arguments)
                except ToolInDoubt as exc:
                    # Nothing was sent yet (no marker is saved): an ordinary failure.
                    await self.finish(call, error_text(exc), True)
                    return True
                except Exception as exc:  # noqa: BLE001 - user code: the model sees it, as for the tool
                    await self.finish(call, error_text(exc), True)
                    return True
                intended = {path: sha256_bytes(data) for path, data in files.items()}
                marker = AttemptMarker(
                    key=idempotency_key(state.run_id, call.id),
                    tool=tool.name,
                    started_at=self.clock(),
                    intended=intended,
                )
            state.markers[call.id] = marker
            intended = dict(marker.intended)
            await self.save(SavePoint.ATTEMPT)  # save point 3
        if self.workspace is not None:
            self.workspace.take_written()
        self.emit("call", call_id=call.id, tool=tool.name, effect=str(tool.effect))
        try:
            ctx = self.context(call, intended)
            with self.trace.tool_call(
                turn=state.turns,
                call_id=call.id,
                tool=tool.name,
                effect=str(tool.effect),
                # Derived here, not read from ctx: reading ctx's key marks it sent, and
                # KeyNotSent must still see a keyed tool that never read it.
                key=(
                    None if tool.effect is Effect.READ else idempotency_key(state.run_id, call.id)
                ),
                marker="none" if tool.effect is Effect.READ else "kept" if previous else "saved",
            ):
                content = await (tool(ctx, **arguments) if run is None else run(ctx))
            is_error = False
        except ToolInDoubt as exc:
            if tool.effect is Effect.READ or previous is not None:
                # Already a second try in this process (or nothing to fear): report it.
                content, is_error = error_text(exc), True
            else:
                said = error_text(exc)
                self.emit("in-doubt", call_id=call.id, tool=tool.name, reason=said)
                return await self.resolve_in_doubt(
                    call, tool, state.markers[call.id], arguments, run=run, said=said
                )
        except KeyNotSent:
            raise  # strict (warnings are errors): the run stops, unsaved, and the test fails
        except Exception as exc:  # noqa: BLE001 - the model sees what went wrong, as the call's result
            content, is_error = error_text(exc), True
            if isinstance(exc, ToolResultError):
                log.error("%s", content, extra={"run_id": state.run_id, "call_id": call.id})
        faults.point(f"loop.tool_returned:{tool.name}")
        await self.finish(call, content, is_error)
        return True

    async def finish(self, call: ToolCall, content: str, is_error: bool) -> None:
        """Save point 4: the call's result, with its marker cleared."""
        self._record_result(call, content, is_error=is_error)
        await self.save(SavePoint.RESULT)
        self.emit("result", call_id=call.id, tool=call.name, is_error=is_error, content=content)
