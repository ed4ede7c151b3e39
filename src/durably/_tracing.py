"""OpenTelemetry spans for a run: one per process's part of the run, turn, model call and tool call.

The engine (:class:`~durably.engine.RunSession`) calls :func:`for_run` once per
session and the returned object's hooks at the places every front end passes:
the model-call marker, the reply's save, each tool call, each ladder verdict and
each event. Spans use the GenAI semantic conventions' names where one exists
(``invoke_agent``, ``chat``, ``execute_tool``; ``gen_ai.request.model``,
``gen_ai.usage.input_tokens``, ``gen_ai.tool.call.id``...) and ``durably.*``
for what only durably knows (the effect, the key, the marker, the ladder's step
and verdict, the restart number, dollars).

No cost when tracing is off. durably never imports ``opentelemetry`` itself:
tracing is on only when the application already imported it *and* set a
tracer provider (``trace.set_tracer_provider``); otherwise :func:`for_run` returns
:data:`OFF`, whose hooks do nothing.

A restart continues the run's trace: the trace ID is derived from the run ID (as
is the span ID of a remote parent standing for the run as a whole), so every
process's spans of one run share one trace with nothing saved in the run state.
A span the caller had open when the run started or resumed is linked, not made
the parent.
"""

from __future__ import annotations

import hashlib
import sys
import weakref
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from typing import Any, Final

__all__ = ["OFF", "RunTrace", "for_run", "trace_id_of"]

_SCOPE: Final = "durably"
_NOTHING: Final = nullcontext()


class _Off:
    """The hooks when tracing is off: each does nothing."""

    enabled = False

    def model_call(self, *, turn: int, model: str) -> None:
        """Tracing is off."""

    def reply(self, *, usage: Any, dollars: float, model: str | None, calls: int) -> None:
        """Tracing is off."""

    def tool_call(
        self, *, turn: int, call_id: str, tool: str, effect: str, key: str | None, marker: str
    ) -> AbstractContextManager[None]:
        """Tracing is off: a context that does nothing (one, reused)."""
        return _NOTHING

    def event(self, kind: str, data: Mapping[str, Any], *, state: Any) -> None:
        """Tracing is off."""


OFF: Final = _Off()


def trace_id_of(run_id: str) -> int:
    """The 128-bit trace ID every process of run ``run_id`` traces under."""
    return int.from_bytes(_digest(run_id)[:16], "big") or 1


def _digest(run_id: str) -> bytes:
    return hashlib.sha256(b"durably-trace\0" + run_id.encode("utf-8")).digest()


def for_run(run_id: str, *, owner: object, state: object) -> RunTrace | _Off:
    """The span hooks for ``owner``, one process's session on run ``run_id`` (or :data:`OFF`).

    Spans ``owner`` leaves open when it is dropped are ended then: as the pause
    it is when ``state`` is paused, else as errors (its front end left by an exception).
    """
    if "opentelemetry.trace" not in sys.modules:
        return OFF  # the application never imported OpenTelemetry: nothing to report to
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return OFF  # imported, but no SDK configured: every span would be dropped
    return RunTrace(run_id, provider.get_tracer(_SCOPE), owner=owner, state=state)


class RunTrace:
    """The spans of one process's part of a run, opened and ended by the engine's hooks.

    The process span (``invoke_agent``) opens here and ends with the run's
    ``done`` or ``paused`` event; a session dropped before either (an exception
    left the front end) ends whatever is still open, marked as an error.
    """

    enabled = True

    def __init__(self, run_id: str, tracer: Any, *, owner: object, state: object) -> None:
        from opentelemetry import trace

        self._trace = trace
        self._tracer = tracer
        self.run_id = run_id
        digest = _digest(run_id)
        run = trace.SpanContext(
            trace_id=trace_id_of(run_id),
            span_id=int.from_bytes(digest[16:24], "big") or 1,
            is_remote=True,
            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
        )
        caller = trace.get_current_span().get_span_context()
        links = [trace.Link(caller)] if caller.is_valid and caller.trace_id != run.trace_id else []
        self._root = trace.set_span_in_context(trace.NonRecordingSpan(run))
        self.process = tracer.start_span(
            "invoke_agent durably",
            context=self._root,
            kind=trace.SpanKind.INTERNAL,
            links=links,
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "durably",
                "gen_ai.conversation.id": run_id,
                "durably.run_id": run_id,
                "durably.restart": 0,
            },
        )
        self._in_process = trace.set_span_in_context(self.process)
        self._turn: Any = None
        self._in_turn: Any = None
        self._turn_number = 0
        self._chat: Any = None
        self._ladder: dict[str, dict[str, Any]] = {}
        self._tools: dict[str, Any] = {}
        self._open = {self.process}
        self._closer = weakref.finalize(
            owner, _end_abandoned, self._open, trace, state, self.process
        )

    def model_call(self, *, turn: int, model: str) -> None:
        """The model-call marker was saved: the turn's span (new turn) and its ``chat`` span."""
        self._end_chat("the model call ended without a saved reply")
        self._chat = self._start(
            f"chat {model}",
            self._turn_span(turn),
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": model,
                "gen_ai.conversation.id": self.run_id,
                "durably.turn": turn,
            },
            kind=self._trace.SpanKind.CLIENT,
        )

    def reply(self, *, usage: Any, dollars: float, model: str | None, calls: int) -> None:
        """The reply was saved: its usage and price end the ``chat`` span."""
        chat, self._chat = self._chat, None
        if chat is None:
            return
        chat.set_attributes(
            {
                "gen_ai.usage.input_tokens": usage.input_tokens,
                "gen_ai.usage.output_tokens": usage.output_tokens,
                "durably.dollars": dollars,
                "durably.calls": calls,
            }
        )
        if model:
            chat.set_attribute("gen_ai.response.model", model)
        self._end(chat)

    def ladder(self, *, turn: int, call_id: str, tool: str, step: int, verdict: str) -> None:
        """An in-doubt call's verdict: on the tool span if it runs again, else a span of its own."""
        attributes = {"durably.ladder.step": step, "durably.ladder.verdict": verdict}
        if verdict in ("rerun", "not-found"):
            self._ladder[call_id] = attributes  # the tool span that follows carries it
        else:  # settled without running: found, done by a person, deferred
            self._end(self._tool_span(turn, call_id, tool, attributes))

    @contextmanager
    def tool_call(
        self, *, turn: int, call_id: str, tool: str, effect: str, key: str | None, marker: str
    ) -> Iterator[None]:
        """The span of one call's run, current while the tool runs (its own spans nest).

        ``marker``: ``saved`` (before this attempt), ``kept`` (from an attempt
        left in doubt) or ``none`` (a ``read`` tool saves none).
        """
        attributes: dict[str, Any] = {"durably.effect": effect, "durably.marker": marker}
        if key is not None:
            attributes["durably.key"] = key
        attributes.update(self._ladder.pop(call_id, {}))
        span = self._tool_span(turn, call_id, tool, attributes)
        self._tools[call_id] = span
        try:
            # The SDK's own recording calls str() on the exception, which user code can
            # make raise: the tool's exception must reach the engine as it was.
            with self._trace.use_span(
                span, end_on_exit=False, record_exception=False, set_status_on_exception=False
            ):
                yield
        except BaseException as exc:
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, type(exc).__name__))
            with suppress(Exception):
                span.record_exception(exc)
            raise
        finally:
            self._tools.pop(call_id, None)
            self._end(span)

    def event(self, kind: str, data: Mapping[str, Any], *, state: Any) -> None:
        """An engine event: a span event on the innermost open span; done or paused end all."""
        if kind == "resumed":
            self.process.set_attribute("durably.restart", state.resumes)
            return
        if kind == "ladder":
            self.ladder(
                turn=state.turns,
                call_id=data["call_id"],
                tool=data["tool"],
                step=data["step"],
                verdict=data["outcome"],
            )
            return
        if kind in ("reply", "result", "call", "started"):
            return  # already a span of its own
        target = next(iter(self._tools.values()), None) or self._turn or self.process
        target.add_event(
            f"durably.{kind}",
            {k: v for k, v in data.items() if isinstance(v, str | int | float | bool)},
        )
        if kind in ("done", "paused", "cancelled"):
            _summarize(self.process, state, kind)
            self._end_chat("the run stopped before the reply was saved")
            self._end(self._turn)
            self._turn = None
            self._end(self.process)
            self._closer.detach()

    # -- helpers ---------------------------------------------------------------------

    def _turn_span(self, turn: int) -> Any:
        """The context of turn ``turn``'s span (its model call, its reply's calls), opened once."""
        if self._turn is None or turn != self._turn_number:
            self._end(self._turn)
            self._turn_number = turn
            self._turn = self._start(
                f"durably.turn {turn}", self._in_process, {"durably.turn": turn}
            )
            self._in_turn = self._trace.set_span_in_context(self._turn)
        return self._in_turn

    def _tool_span(self, turn: int, call_id: str, tool: str, attributes: dict[str, Any]) -> Any:
        return self._start(
            f"execute_tool {tool}",
            self._turn_span(turn),
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool,
                "gen_ai.tool.call.id": call_id,
                "gen_ai.tool.type": "function",
                **attributes,
            },
        )

    def _start(
        self, name: str, context: Any, attributes: dict[str, Any], *, kind: Any = None
    ) -> Any:
        span = self._tracer.start_span(
            name,
            context=context,
            kind=kind or self._trace.SpanKind.INTERNAL,
            attributes=attributes,
        )
        self._open.add(span)
        return span

    def _end(self, span: Any) -> None:
        if span is not None and span in self._open:
            self._open.discard(span)
            span.end()

    def _end_chat(self, why: str) -> None:
        chat, self._chat = self._chat, None
        if chat is not None:
            chat.set_status(self._trace.Status(self._trace.StatusCode.ERROR, why))
            self._end(chat)


def _summarize(process: Any, state: Any, outcome: str) -> None:
    """What the process span says at its end: the run's dollars and tokens so far, and why."""
    process.set_attributes(
        {
            "durably.dollars": state.dollars,
            "durably.outcome": outcome,
            "gen_ai.usage.input_tokens": state.usage.input_tokens,
            "gen_ai.usage.output_tokens": state.usage.output_tokens,
        }
    )


def _end_abandoned(spans: set[Any], trace: Any, state: Any, process: Any) -> None:
    """End the spans a dropped session left open: a pause as such, anything else as an error."""
    paused = str(state.phase) == "paused"
    for span in list(spans):
        if not paused:
            span.set_status(trace.Status(trace.StatusCode.ERROR, "the run stopped here"))
        if span is process:
            _summarize(span, state, "paused" if paused else "stopped")
        span.end()
    spans.clear()
