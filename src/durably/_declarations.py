"""An agent's declarations, checked where they are made (issue 32).

A mistake in how an agent is put together must fail when the agent is built,
with a ``TypeError`` or ``ValueError`` that names the fix, never later in a run
(the model's first call, a crash recovery) or not at all (an approver that says
yes to everything because none was given). :class:`~durably.Agent` and
:class:`~durably.Limits` call these; the tool's own declaration is checked by
:func:`durably.tool`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .approval import Approver
from .tools import Tool

__all__ = [
    "check_approver",
    "check_limit_fields",
    "check_model",
    "check_someone_approves",
    "checked_tools",
]

_NO_APPROVER = (
    "no approver was given, and the tool(s) {names} need approval: say who answers, "
    "approver=durably.TerminalApprover() (a person at this terminal), "
    "approver=durably.AskLater() (the run pauses; a person answers with `durably answer` "
    "or the console), or approver=durably.PolicyApprover() to approve every call "
    "without asking anyone"
)


def checked_tools(tools: Iterable[Tool]) -> dict[str, Tool]:
    """The agent's tools by name, each a declared :class:`~durably.Tool`.

    Raises:
        TypeError: ``tools`` is not a collection of tools, or one of them is a
            plain function (or anything else) that was never declared.
        ValueError: two tools share a name (the model could not tell them apart).
    """
    if isinstance(tools, Tool) or callable(tools) or isinstance(tools, str | bytes):
        raise TypeError(f"tools must be a list of tools, got {_shown(tools)}: write tools=[...]")
    try:
        given = list(tools)
    except TypeError as exc:
        raise TypeError(f"tools must be a list of tools, got {_shown(tools)}") from exc
    found: dict[str, Tool] = {}
    for index, item in enumerate(given):
        if not isinstance(item, Tool):
            if callable(item):
                what = getattr(item, "__name__", type(item).__name__)
                raise TypeError(
                    f"tools[{index}] is {what!r}, a plain function, not a tool: declare it "
                    "with @durably.tool(effect=...) (say what it does to the world)"
                )
            raise TypeError(
                f"tools[{index}] is {_shown(item)}, not a tool: declare tools with "
                "@durably.tool(effect=...), durably.transports.http_tool or mcp_tools"
            )
        if item.name in found:
            raise ValueError(f"two tools are named {item.name!r}: give one name=... of its own")
        found[item.name] = item
    return found


def check_model(model: object) -> None:
    """Refuse a model given as a name, or anything without ``name`` and ``reply``.

    Raises:
        TypeError: with the way to build the model the name means.
    """
    if isinstance(model, str):
        raise TypeError(
            f"model={model!r} is a name, not a model: build it as `--model` does, "
            f"model=durably.models.select.choose_model({model!r}), or from its adapter "
            "(durably.models.anthropic, durably.models.openai; durably.ScriptedModel in tests)"
        )
    if not (
        isinstance(getattr(model, "name", None), str) and callable(getattr(model, "reply", None))
    ):
        raise TypeError(
            f"model must be a durably.Model (a `name` and an async `reply(request)`), "
            f"got {_shown(model)}"
        )


def check_approver(approver: object, tools: Iterable[Tool]) -> None:
    """Refuse a missing approver where a tool needs approval, or a thing that cannot answer.

    Raises:
        TypeError: naming ``TerminalApprover``, ``AskLater`` and ``PolicyApprover``.
    """
    if approver is None:
        check_someone_approves(None, [t.name for t in tools if t.needs_approval])
        return
    if not isinstance(approver, Approver):
        raise TypeError(
            f"approver must answer approve(request) and resolve(request), got {_shown(approver)}: "
            "use durably.TerminalApprover(), durably.AskLater() or durably.PolicyApprover()"
        )


def check_someone_approves(approver: object, asking: Iterable[str]) -> None:
    """Refuse no approver where the tools named in ``asking`` need a person's yes.

    Raises:
        TypeError: naming the tools, ``TerminalApprover``, ``AskLater`` and ``PolicyApprover``.
    """
    names = sorted(asking)
    if approver is None and names:
        raise TypeError(_NO_APPROVER.format(names=", ".join(map(repr, names))))


def check_limit_fields(limits: Any) -> None:
    """Refuse a limit of the wrong type (``max_dollars="2"``), naming the field and the fix.

    Raises:
        TypeError: a field that is not a number of the right kind.
    """
    for name in ("max_turns", "max_tokens", "max_resumes"):
        value = getattr(limits, name)
        if value is None and name != "max_resumes":
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(
                f"Limits.{name} must be a whole number"
                f"{'' if name == 'max_resumes' else ' (or None for no limit)'}, got {value!r}"
            )
    dollars = limits.max_dollars
    if dollars is not None and (isinstance(dollars, bool) or not isinstance(dollars, int | float)):
        raise TypeError(
            f"Limits.max_dollars must be a number of dollars such as 2.0 (or None for no "
            f"limit), got {dollars!r}"
        )


def _shown(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}"
