"""The exactly-once engine every front end drives: save points, markers, keys, the ladder.

A :class:`RunSession` is one process's hold on one run. It holds what is not
about any model or framework (docs/concepts.md, "Save points"): the model-call
marker and the reply save, the attempt marker with the derived key, the result
save, the ladder, the person's question, limits and restart counting, and the
agent's fingerprint. durably's own :class:`~durably.Agent` drives it, and so
does each framework adapter (``durably.pydantic_ai``): the adapter maps its
framework's hooks onto :meth:`RunSession.mark_model_call`,
:meth:`RunSession.save_reply`, :meth:`RunSession.settle` and the rest, and owns
nothing else.

The save points are a type, :class:`SavePoint`; the other saves the engine makes
(the model-call marker, the restart count, a limit reached) are :class:`Save`.
Each one's crash-point label (``loop.saved.<value>``) derives from it.
"""

from .calls import RunSession
from .records import (
    CRASH_POINT_PREFIX,
    OUTCOME_SOURCES,
    Decisions,
    Event,
    EventKind,
    HistoryPolicy,
    Limits,
    Outcome,
    Save,
    SavePoint,
    differences,
    shielded,
)

__all__ = [
    "CRASH_POINT_PREFIX",
    "OUTCOME_SOURCES",
    "Decisions",
    "Event",
    "EventKind",
    "HistoryPolicy",
    "Limits",
    "Outcome",
    "RunSession",
    "Save",
    "SavePoint",
    "differences",
    "shielded",
]
