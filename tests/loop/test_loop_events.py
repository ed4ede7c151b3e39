"""The loop's events: every kind it emits is one of ``EventKind``, and every kind is documented."""

from __future__ import annotations

import ast
import inspect
from typing import get_args

import durably.engine
import durably.loop
import durably.models
from durably.loop import Event, EventKind

KINDS = set(get_args(EventKind))


def _emitted_kinds() -> set[str]:
    """Every string the loop's source passes as an event's kind (``emit``, ``Event(kind=)``).

    The loop's source is ``durably.loop`` and the engine it drives, ``durably.engine``.
    """
    found: set[str] = set()
    engine = [durably.engine.core, durably.engine.calls, durably.engine.records]
    source = "\n".join(inspect.getsource(module) for module in [durably.loop, *engine])
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else None
        if name == "emit" and node.args:
            kind = node.args[0]
        else:
            kind = next((k.value for k in node.keywords if k.arg == "kind"), None)  # type: ignore[assignment]
            if kind is None:
                continue
        found.update(
            n.value
            for n in ast.walk(kind)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
        )
    return found


def test_every_kind_the_loop_emits_is_an_event_kind() -> None:
    """Each kind the loop's source emits, including both arms of a conditional, is in
    ``EventKind`` (mypy checks the same through ``emit``'s signature).
    """
    emitted = _emitted_kinds()

    assert {"started", "approved", "refused", "in-doubt", "unavailable"} <= emitted
    assert emitted <= KINDS


def test_every_event_kind_is_emitted_by_the_loop_or_a_streaming_model() -> None:
    """``EventKind`` lists no kind that nothing emits (the deltas come from ``Delta.kind``)."""
    text, arguments = durably.models.Delta(text="a"), durably.models.Delta(text="{", call_id="c1")
    streamed = {text.kind, arguments.kind}

    assert _emitted_kinds() | streamed == KINDS


def test_every_event_kind_is_documented_on_event() -> None:
    """``Event``'s docstring names every kind, so a new kind cannot go undocumented."""
    documented = Event.__doc__ or ""

    missing = sorted(kind for kind in KINDS if f"``{kind}``" not in documented)
    assert missing == []
    assert len(KINDS) == 16
