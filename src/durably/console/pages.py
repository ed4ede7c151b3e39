"""The console's pages (runs, questions, one run), rendered on the server from run states.

The building blocks (escaping, cut text, the layout) are :mod:`._html`'s.

Text from the model, the tools and the task reaches the page only through
:func:`e` (``html.escape`` with quotes), so a reply that contains ``<script>``
shows as text. The pages load one script, ``static/console.js``, and the
server's Content-Security-Policy allows no other: even a missed escape could not
run a script. Every link starts with the page's ``root`` (``/t/<token>/``, see
:mod:`.server`). A text longer than :data:`SHOWN` characters is cut, with a link
to the whole of it (:func:`whole_text`), so one long reply cannot make a page of
hundreds of megabytes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from urllib.parse import quote

from ..decisions import Question, questions
from ..keys import idempotency_key
from ..listing import RunSummary, in_phase, lease_text, phase_text
from ..state import AssistantMessage, Decision, Phase, RunState, ToolResult, UserMessage, age
from ._html import (
    SHOWN,
    FileCheck,
    Page,
    block,
    e,
    layout,
    phase_badge,
    pre,
    shown_arguments,
    whole_link,
)

__all__ = [
    "CONFIRM",
    "SHOWN",
    "FileCheck",
    "Page",
    "e",
    "error_page",
    "locked_page",
    "questions_page",
    "questions_version",
    "rerun_warning",
    "run_page",
    "runs_page",
    "runs_version",
    "version_of",
    "whole_text",
]

TOOL_SAID = "; the tool said: "
"""How the loop joins a tool's ``ToolInDoubt`` text to the ladder's reason in a question's why."""


def whole_text(state: RunState, part: str) -> str | None:
    """The whole of one text of a run that a page may cut, by its ``part`` name; None: no such.

    Parts: ``task``, ``answer``, ``summary``, ``message-<n>`` (the n-th message's text,
    from 0) and ``arguments-<call ID>`` (as the model sent them).
    """
    simple = {"task": state.task, "answer": state.answer, "summary": state.summary}
    if part in simple:
        return simple[part]
    kind, _, which = part.partition("-")
    if kind == "message" and which.isdigit() and int(which) < len(state.messages):
        message = state.messages[int(which)]
        if isinstance(message, ToolResult):
            return message.content
        return message.text
    if kind == "arguments":
        for message in reversed(state.messages):
            if isinstance(message, AssistantMessage):
                for call in message.calls:
                    if call.id == which:
                        return call.arguments
    return None


def locked_page() -> str:
    """What an address without the console's token gets: how to open the console, nothing else."""
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8"><title>durably console</title></head>'
        "<body><h1>durably console</h1><p>This address does not carry the console's token. "
        "Open the address <code>durably console</code> printed when it started "
        "(<code>http://HOST:PORT/t/…/</code>); the token changes at every start.</p>"
        "</body></html>"
    )


def version_of(states: Iterable[RunState | RunSummary]) -> str:
    """A short digest of what the page shows, so the script swaps it only when it changed."""
    digest = hashlib.sha256()
    for state in states:
        stamp = state.saved_at.isoformat() if state.saved_at else ""
        if isinstance(state, RunSummary) and (state.owner or state.parked):
            # A claim or a park changes no save (a run page's stamp, from a state or a
            # file store's summary, has neither, so both stamps of a run stay equal).
            stamp += f"|{state.owner}|{state.claimed}|{state.parked}"
        digest.update(f"{state.run_id}|{state.phase}|{stamp}\n".encode())
    return digest.hexdigest()[:16]


def runs_version(runs: Sequence[RunSummary], problems: Sequence[str], phase: str | None) -> str:
    """The version of the runs page (:func:`runs_page`), also its poll's change stamp."""
    shown = [s for s in runs if phase is None or in_phase(s, phase)]
    return version_of(shown) + str(len(problems))


def questions_version(runs: Sequence[RunSummary]) -> str:
    """The version of the questions page (:func:`questions_page`), also its poll's stamp."""
    waiting = [s for s in runs if s.questions]
    return version_of(waiting) + str(sum(len(s.questions) for s in waiting))


# -- runs ---------------------------------------------------------------------------------


def runs_page(
    page: Page, runs: Sequence[RunSummary], problems: Sequence[str], phase: str | None
) -> str:
    """The table of runs (from their summaries), optionally only those in one phase."""
    shown = [s for s in runs if phase is None or in_phase(s, phase)]
    # A Postgres fleet: queued runs, who holds each lease and until when.
    fleet = any(s.agent is not None or s.owner is not None for s in runs)
    filters = ['<p class="filters">phase: ']
    names = [str(p) for p in Phase] + (["queued", "claimed", "parked"] if fleet else [])
    for name in (None, *names):
        label = name or "all"
        href = page.root if name is None else f"{page.root}?phase={quote(name)}"
        current = ' aria-current="page"' if name == phase else ""
        filters.append(f'<a href="{e(href)}"{current}>{e(label)}</a>')
    filters.append("</p>")
    rows = []
    for state in shown:
        waiting = len(state.questions)
        holder = (
            f"<td>{e(state.agent or '-')}</td><td>{e(state.owner or '-')}</td>"
            f"<td>{e(lease_text(state))}</td>"
            if fleet
            else ""
        )
        shown_phase = phase_badge(state.phase) if state.parked is None else e(phase_text(state))
        rows.append(
            "<tr>"
            f'<td><a href="{e(page.root)}runs/{e(quote(state.run_id))}">{e(state.run_id)}</a></td>'
            f"<td>{shown_phase}</td>"
            f"{holder}"
            f"<td>{state.turns}</td>"
            f"<td>${state.dollars:.4f}</td>"
            f"<td>{state.resumes}</td>"
            f"<td>{e(age(state.saved_at))}</td>"
            f"<td>{waiting if waiting else ''}</td>"
            "</tr>"
        )
    holders = "<th>agent</th><th>owner</th><th>lease</th>" if fleet else ""
    table = (
        f"<table><thead><tr><th>run</th><th>phase</th>{holders}<th>turns</th><th>dollars</th>"
        "<th>restarts</th><th>last saved</th><th>waiting questions</th></tr></thead>"
        f"<tbody>{''.join(rows) or '<tr><td colspan=10>no runs</td></tr>'}</tbody></table>"
    )
    broken = "".join(f'<div class="notice error">{e(p)}</div>' for p in problems)
    body = f"<h1>Runs</h1>{''.join(filters)}{broken}{table}"
    return layout(page, "runs", body, runs_version(runs, problems, phase))


# -- questions ----------------------------------------------------------------------------


def _question(page: Page, question: Question, *, with_run: bool) -> str:
    kind = "approval" if question.kind == "approve" else "in doubt"
    head = (
        f"<strong>{e(kind)}</strong>: <code>{e(question.tool)}</code> "
        f'<span class="effect-{e(question.effect or "")}">{e(question.effect or "")}</span> '
        f'<span class="dim">call {e(question.call_id)} · key {e(question.key)} · '
        f"asked {e(age(question.asked_at))}"
        + (
            f" · attempt started {e(question.started_at.isoformat())}"
            if question.started_at
            else ""
        )
        + "</span>"
    )
    if with_run:
        link = f"{page.root}runs/{quote(question.run_id)}"
        head += f'<div>run <a href="{e(link)}">{e(question.run_id)}</a></div>'
    why = ""
    if question.why:
        # The loop appends the tool's ToolInDoubt text to the ladder's reason.
        reason, _, said = question.why.partition(TOOL_SAID)
        why = f"<div>why a person: {e(reason)}</div>"
        if said:
            why += f'<div class="said">the tool said: <code>{e(said)}</code></div>'

    whole = whole_link(page, question.run_id, f"arguments-{question.call_id}")
    args = pre(shown_arguments(question.arguments), whole=whole)
    return (
        f'<div class="question" id="q-{e(question.call_id)}" data-run="{e(question.run_id)}" '
        f'data-call="{e(question.call_id)}">{head}{why}{args}{_forms(page, question)}</div>'
    )


CONFIRM = "rerun"
"""The value of the rerun form's ``confirm`` checkbox: a rerun posted without it saves nothing."""

_REPEAT = {
    "write": "it writes without a key, so the service cannot tell the repeat from a new request",
    "keyed": "its key is past the time the service remembers keys, so the repeat may not be "
    "dropped",
}
"""Why a repeat lands twice, by the tool's effect (the ladder asks a person about no other)."""


def _short(arguments: str, limit: int = 120) -> str:
    """A call's arguments in one short line: ``name="value", ...`` from JSON, else as sent."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        text = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in parsed.items())
    else:
        text = " ".join(arguments.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def rerun_warning(question: Question) -> str:
    """What a rerun may repeat, as the confirmation asks it: the tool, its effect, its arguments."""
    effect = question.effect or "unknown"
    why = _REPEAT.get(effect, "a repeat may not be harmless")
    return (
        f"Run {question.tool} again? If it did happen, {question.tool}"
        f"({_short(question.arguments)}) happens twice: its effect is {effect}, and {why}."
    )


def _forms(page: Page, question: Question) -> str:
    if page.read_only:
        return '<div class="dim">read-only console: answer with `durably answer`</div>'
    # The token is the address's own (page.root): the form needs no field for it.
    action = e(f"{page.root}runs/{quote(question.run_id)}/answer")
    hidden = f'<input type="hidden" name="call" value="{e(question.call_id)}">'
    if question.kind == "approve":
        return (
            f'<form method="post" action="{action}">{hidden}'
            '<button class="yes" name="answer" value="yes">approve</button></form>'
            f'<form method="post" action="{action}">{hidden}'
            '<input type="text" name="reason" placeholder="reason the model will see">'
            '<button class="no" name="answer" value="no">refuse</button></form>'
        )
    # A rerun of a call that did happen does it twice: the form asks first, with the
    # browser's own check (``required``, no script needed) and the server's (CONFIRM).
    return (
        f'<form method="post" action="{action}" class="rerun-form">{hidden}'
        f'<label class="confirm"><input type="checkbox" name="confirm" value="{CONFIRM}" '
        f"required> {e(rerun_warning(question))}</label>"
        '<button class="rerun" name="answer" value="rerun">it did not happen: rerun</button>'
        "</form>"
        f'<form method="post" action="{action}">{hidden}'
        '<input type="text" name="result" placeholder="what the call returned">'
        '<button class="done" name="answer" value="done">it happened: done</button></form>'
    )


def questions_page(page: Page, runs: Sequence[RunSummary], problems: Sequence[str]) -> str:
    """Every open question of the store (from the runs' summaries), with forms to answer them."""
    waiting = [s for s in runs if s.questions]
    blocks = [_question(page, q, with_run=True) for s in waiting for q in s.questions]
    broken = "".join(f'<div class="notice error">{e(p)}</div>' for p in problems)
    body = f"<h1>Open questions ({len(blocks)})</h1>{broken}" + (
        "".join(blocks) or '<p class="dim">nothing waits for a person</p>'
    )
    return layout(page, "questions", body, questions_version(runs))


# -- one run ------------------------------------------------------------------------------


def _money(dollars: float) -> str:
    return f"${dollars:.4f}"


def _spend_chart(state: RunState) -> str:
    """Dollars spent after each turn, as a small inline SVG with a y-axis in dollars.

    The run's dollar limit is a dashed line when the run recorded one (``max_dollars``).
    """
    kept = [m for m in state.messages if isinstance(m, AssistantMessage)]
    # Replies a summary replaced are gone from the messages; their cost is in state.dollars.
    total = max(state.dollars - sum(m.dollars for m in kept), 0.0)
    points: list[tuple[int, float]] = [(0, total)]
    for message in kept:
        total += message.dollars
        points.append((message.turn or len(points), total))
    if len(points) < 2:
        return '<p class="dim">no model reply yet</p>'
    width, height = 520, 160
    left, right, top_pad, bottom = 72, 16, 24, 28
    spent = points[-1][1]
    budget = state.max_dollars
    top = max(max(p[1] for p in points), budget or 0.0)
    scale = top or 1.0  # nothing spent, no budget: the line lies on the axis
    last = max(p[0] for p in points) or 1

    def x(turn: int) -> float:
        return left + (width - left - right) * turn / last

    def y(dollars: float) -> float:
        return height - bottom - (height - top_pad - bottom) * dollars / scale

    coords = " ".join(f"{x(turn):.1f},{y(dollars):.1f}" for turn, dollars in points)
    ticks = [0.0] if top == 0 else [0.0, top / 2, top]
    axis = [
        f'<line class="axis" x1="{left}" y1="{top_pad}" x2="{left}" y2="{height - bottom}" '
        'stroke="#6b7280"/>',
        f'<line class="axis" x1="{left}" y1="{height - bottom}" x2="{width - right}" '
        f'y2="{height - bottom}" stroke="#6b7280"/>',
    ]
    for tick in ticks:
        axis.append(
            f'<text class="tick" x="{left - 6}" y="{y(tick) + 4:.1f}" font-size="11" '
            f'text-anchor="end">{_money(tick)}</text>'
        )
    if budget is not None:
        axis.append(
            f'<line class="budget" x1="{left}" y1="{y(budget):.1f}" x2="{width - right}" '
            f'y2="{y(budget):.1f}" stroke="#a61b1b" stroke-dasharray="6 4"/>'
            f'<text class="budget" x="{width - right}" y="{y(budget) - 4:.1f}" font-size="11" '
            f'text-anchor="end" fill="#a61b1b">budget {_money(budget)} (max_dollars)</text>'
        )
    note = "" if state.summarized == 0 else " (the line starts after the summary)"
    return (
        f'<svg class="spend" width="{width}" height="{height}" role="img" '
        f'aria-label="spend over turns">{"".join(axis)}'
        f'<polyline fill="none" stroke="#0b3d91" stroke-width="2" points="{coords}"/>'
        f'<text class="label" x="{left + 6}" y="16" font-size="11">'
        f"{_money(spent)} after turn {points[-1][0]}{e(note)}</text>"
        f'<text x="{left}" y="{height - 8}" font-size="11">turn 0</text>'
        f'<text x="{width - right}" y="{height - 8}" font-size="11" text-anchor="end">'
        f"turn {last}</text></svg>"
    )


def _timeline(page: Page, state: RunState) -> str:
    effects = {t.name: str(t.effect) for t in state.fingerprint.tools} if state.fingerprint else {}
    results: dict[str, tuple[int, ToolResult]] = {
        m.call_id: (n, m) for n, m in enumerate(state.messages) if isinstance(m, ToolResult)
    }
    parts = []

    def whole(part: str) -> str:
        return whole_link(page, state.run_id, part)

    if state.summary:
        parts.append(
            f'<div class="turn"><div class="meta">summary of {state.summarized} earlier '
            f"messages</div>{pre(state.summary, whole=whole('summary'))}</div>"
        )
    for n, message in enumerate(state.messages):
        if isinstance(message, UserMessage):
            text = pre(message.text, whole=whole(f"message-{n}"))
            parts.append(f'<div class="turn"><div class="meta">user</div>{text}</div>')
        elif isinstance(message, AssistantMessage):
            calls = "".join(
                _call(page, state, c.id, c.name, c.arguments, effects, results)
                for c in message.calls
            )
            usage = message.usage
            parts.append(
                f'<div class="turn" id="turn-{message.turn}"><div class="meta">turn '
                f"{message.turn} · {e(message.model or '')} · {usage.input_tokens} in / "
                f"{usage.output_tokens} out · ${message.dollars:.4f}</div>"
                f"{pre(message.text or '', whole=whole(f'message-{n}'), css='reply')}{calls}</div>"
            )
    parts.append(_restarts(state))
    return "".join(parts)


def _restarts(state: RunState) -> str:
    """The run's restarts, as a marker after the turns: the state counts them, not when."""
    if not state.resumes and not state.unsaved_replies:
        return ""
    text = f"restarted {state.resumes} time{'' if state.resumes == 1 else 's'} so far"
    if state.unsaved_replies:
        lost = state.unsaved_replies
        one = lost == 1
        its = "its" if one else "their"
        text += (
            f"; {lost} model repl{'y' if one else 'ies'} lost before {its} save, "
            f"counted at {its} worst case ({_money(state.unsaved_dollars)})"
        )
    return (
        f'<div class="restart" role="note">⟲ {e(text)} '
        '<span class="dim">(the run state counts restarts but does not record when each '
        "happened, so they are not placed between the turns)</span></div>"
    )


def _call(  # noqa: PLR0917 - private, one caller: a call's card from what the run page already holds
    page: Page,
    state: RunState,
    call_id: str,
    name: str,
    arguments: str,
    effects: Mapping[str, str],
    results: Mapping[str, tuple[int, ToolResult]],
) -> str:
    effect = effects.get(name, "")
    marker = state.markers.get(call_id)
    lines = [
        f'<div><code>{e(name)}</code> <span class="effect-{e(effect)}">{e(effect)}</span> '
        f'<span class="dim">{e(call_id)} · key {e(idempotency_key(state.run_id, call_id))}'
        "</span></div>",
        block(
            shown_arguments(arguments),
            label="arguments",
            whole=whole_link(page, state.run_id, f"arguments-{call_id}"),
        ),
    ]
    # In the order things happen to a call: the approval (before it may run), the attempt
    # marker (it started), the ladder's verdict (it was in doubt), a question waiting,
    # the result. The state keeps the last verdict of each call, without its time.
    # approvals_given outlives the reply; decisions alone is what a checkpoint older than it has.
    decision = state.approvals_given.get(call_id) or state.decisions.get(call_id)
    if decision is not None:
        lines.append(f'<div class="approval">{_approval(decision)}</div>')
    resolution = state.resolutions.get(call_id)
    if marker is not None:
        lines.append(
            f'<div class="marker">attempt marker: started {e(marker.started_at.isoformat())} '
            "(the call may have acted)</div>"
        )
    if resolution is not None:
        step = {1: "rerun (harmless)", 2: "lookup", 3: "a person"}.get(resolution.step, "")
        lines.append(
            f'<div class="verdict">ladder: step {resolution.step} ({e(step)}) → '
            f"{e(resolution.outcome)}"
            + (f" · {e(resolution.detail)}" if resolution.detail else "")
            + (f" · answered by {e(resolution.by)}" if resolution.by else "")
            + "</div>"
        )
        if marker is not None and call_id not in results:
            lines.append(
                '<div class="marker">run again after the verdict; no result saved yet '
                "(it may have acted again)</div>"
            )
    pending = state.pending.get(call_id)
    if pending is not None:
        lines.append("<div><strong>waiting for a person</strong> (see the questions above)</div>")
    found = results.get(call_id)
    if found is not None:
        n, result = found
        label = "error" if result.is_error else "result"
        whole = whole_link(page, state.run_id, f"message-{n}")
        lines.append(
            f'<div class="dim">{label}</div>'
            + block(result.content, label=label, whole=whole, css="result")
        )
    doubt = " in-doubt" if marker is not None else ""
    return f'<div class="call{doubt}" id="call-{e(call_id)}">{"".join(lines)}</div>'


def _approval(decision: Decision) -> str:
    """``approved by X at T`` or ``refused by X at T: reason``, escaped."""
    text = "approved" if decision.approved else "refused"
    if decision.by:
        text += f" by {decision.by}"
    if decision.decided_at:
        text += f" at {decision.decided_at.isoformat(timespec='seconds')}"
    if not decision.approved:
        text += f": {decision.reason or '(no reason given)'}"
    return f"approval: {e(text)}"


def _files(checks: Sequence[FileCheck] | None) -> str:
    if checks is None:
        return (
            '<p class="dim">the run recorded no workspace files, or the console does not know '
            "where its workspace is (--workspace)</p>"
        )
    rows = []
    for check in checks:
        good = check.status == "matches"
        style = "match-ok" if good else ("dim" if check.status == "not checked" else "match-bad")
        rows.append(
            f"<tr><td><code>{e(check.path)}</code></td><td><code>{e(check.recorded[:16])}</code>"
            f'</td><td class="{style}">{e(check.status)}</td></tr>'
        )
    return (
        "<table><thead><tr><th>file</th><th>recorded SHA-256</th><th>on disk</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _task(page: Page, state: RunState) -> str:
    """The task's first line, at most 300 characters, with a link when that is not all of it."""
    if not state.task:
        return "<pre>-</pre>"
    first = state.task[:300].splitlines()[0]
    link = ""
    if first != state.task:
        href = e(whole_link(page, state.run_id, "task"))
        link = f' <a class="cut dim" href="{href}">the whole task</a>'
    return f"<pre>{e(first)}</pre>{link}"


def run_page(page: Page, state: RunState, checks: Sequence[FileCheck] | None) -> str:
    """One run: facts, open questions, spend, timeline, workspace files."""
    facts = [
        ("phase", phase_badge(state.phase)),
        ("task", _task(page, state)),
        ("turns", str(state.turns)),
        (
            "spent",
            f"${state.dollars:.4f} ({state.usage.input_tokens} in / "
            f"{state.usage.output_tokens} out)",
        ),
        ("restarts", str(state.resumes)),
        ("created", e(state.created_at.isoformat(timespec="seconds"))),
        ("last saved", e(age(state.saved_at))),
    ]
    if state.stop_reason:
        facts.append(("stopped", e(state.stop_reason)))
    if state.answer is not None:
        whole = whole_link(page, state.run_id, "answer")
        facts.append(("answer", pre(state.answer, whole=whole, css="answer")))
    dl = "".join(f"<dt>{e(k)}</dt><dd>{v}</dd>" for k, v in facts)
    open_questions = questions(state)
    waiting = ""
    if open_questions:
        waiting = f"<h2>Waiting for a person ({len(open_questions)})</h2>" + "".join(
            _question(page, q, with_run=False) for q in open_questions
        )
    elif state.phase is not Phase.DONE and state.decisions:
        waiting = (
            '<div class="notice info">answered; the run carries on when a process resumes it '
            "(durably resume, the command that started it, or a worker on Postgres)</div>"
        )
    body = (
        f'<h1>{e(state.run_id)}</h1><dl class="facts">{dl}</dl>{waiting}'
        f"<h2>Spend</h2>{_spend_chart(state)}"
        f"<h2>Timeline</h2>{_timeline(page, state)}"
        f"<h2>Workspace files</h2>{_files(checks)}"
    )
    return layout(page, state.run_id, body, version_of([state]))


def error_page(page: Page, title: str, message: str) -> str:
    """A page that only says what went wrong."""
    body = f'<h1>{e(title)}</h1><div class="notice error" role="alert">{e(message)}</div>'
    return layout(page, title, body, "error")
