"""Models: the seam between the loop and whatever writes the replies.

A :class:`Model` takes a :class:`ModelRequest` (system prompt, the conversation,
the tool schemas, the turn number) and returns a :class:`Reply`: text, tool
calls with the model's call IDs and raw argument strings, and usage. A model
call has no side effect, so adapters may retry transient failures inside it.

A model that streams hands each piece of the reply, as it arrives, to the
request's ``on_delta`` as a :class:`Delta`; the reply it returns is still the
whole reply, and only that is saved. Pieces of an attempt that failed are not
taken back: a listener shows them, it never keeps them.

:class:`ScriptedModel` answers from a list given in code, by turn, so a resumed
run in a new process continues the script. It can log every call it answers to
a file, which is how tests count replies paid twice across processes.

Everything an adapter returns is user code's output: :func:`checked_reply`
refuses a reply of the wrong shape (a non-string call ID, negative usage, text
UTF-8 cannot encode) with a :class:`~durably.ModelError` naming the model and
the turn, before anything of it is saved.

Before each call the loop prices the call's worst case (:func:`worst_case`): a
model may say what a request can use at most through an optional
``usage_bound(request) -> Usage`` method; otherwise the bound is the request's
size (a token is at least one byte) plus the model's ``max_output_tokens`` (or
``max_tokens``) attribute.
"""

from ._scripted import CallLog as CallLog
from ._scripted import Fickle as Fickle
from ._scripted import ScriptedModel as ScriptedModel
from ._seam import Call as Call
from ._seam import Delta as Delta
from ._seam import Model as Model
from ._seam import ModelRequest as ModelRequest
from ._seam import Price as Price
from ._seam import Reply as Reply
from ._seam import ToolSpec as ToolSpec
from ._seam import UsageBound as UsageBound
from ._seam import checked_reply as checked_reply
from ._seam import usage_problem as usage_problem
from ._worst_case import WorstCase as WorstCase
from ._worst_case import priced as priced
from ._worst_case import request_tokens_bound as request_tokens_bound
from ._worst_case import sized_worst_case as sized_worst_case
from ._worst_case import worst_case as worst_case

__all__ = [
    "Call",
    "CallLog",
    "Delta",
    "Model",
    "ModelRequest",
    "Price",
    "Reply",
    "ScriptedModel",
    "ToolSpec",
    "UsageBound",
    "WorstCase",
    "checked_reply",
    "worst_case",
]
