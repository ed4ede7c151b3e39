"""The console's HTML, rendered on the server from run states.

Text from the model, the tools and the task reaches the page only through
:func:`e` (``html.escape`` with quotes), so a reply that contains ``<script>``
shows as text. The pages load one script, ``/static/console.js``, and the
server's Content-Security-Policy allows no other: even a missed escape could not
run a script.
"""

from __future__ import annotations

import hashlib
import html
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote

from ..decisions import Question, questions
from ..keys import idempotency_key
from ..listing import RunSummary
from ..state import AssistantMessage, Decision, Phase, RunState, ToolResult, UserMessage, age

__all__ = ["FileCheck", "Page", "e", "questions_page", "run_page", "runs_page"]


def e(text: object) -> str:
    """``text`` escaped for HTML, quotes included."""
    return html.escape(str(text), quote=True)


def _pretty(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except ValueError:
        return arguments


def _block(text: str, *, label: str, css: str = "") -> str:
    """Text in a ``<pre>``; long text folded in a ``<details>`` that opens on a click."""
    lines = text.splitlines()
    attribute = f' class="{css}"' if css else ""
    if len(lines) <= 8 and len(text) <= 600:
        return f"<pre{attribute}>{e(text)}</pre>"
    first = (lines[0] if lines else "")[:120]
    count = f"{len(lines)} line{'' if len(lines) == 1 else 's'}"
    return (
        f'<details><summary><code>{e(first)}</code> <span class="dim">… {e(label)}, '
        f"{count}</span></summary><pre{attribute}>{e(text)}</pre></details>"
    )


def _phase(phase: Phase | str) -> str:
    return f'<span class="phase phase-{e(phase)}">{e(phase)}</span>'


@dataclass(frozen=True, kw_only=True)
class Page:
    """What every page shares: the store's name, the write token (None: no forms)."""

    store: str
    token: str | None
    read_only: bool
    notice: str | None = None
    """An error to show at the top (a refused answer), already worded for a person."""
    saved: str | None = None
    """A confirmation to show at the top."""


@dataclass(frozen=True, kw_only=True)
class FileCheck:
    """One workspace file the run recorded, and what is on disk now."""

    path: str
    recorded: str
    status: str
    """``matches``, ``changed``, ``missing``, or ``not checked``."""


def _layout(page: Page, title: str, body: str, version: str) -> str:
    notices = ""
    if page.notice:
        notices += f'<div class="notice error" role="alert">{e(page.notice)}</div>'
    if page.saved:
        notices += f'<div class="notice ok" role="status">{e(page.saved)}</div>'
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f"<title>{e(title)} · durably</title>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="stylesheet" href="/static/console.css"></head><body>'
        '<header><strong>durably</strong><a href="/">runs</a>'
        '<a href="/questions">questions</a>'
        f'<span class="store">{e(page.store)}'
        f"{' · read-only' if page.read_only else ''}</span></header>"
        f'<main data-version="{e(version)}">{notices}{body}</main>'
        '<script src="/static/console.js"></script></body></html>'
    )


def version_of(states: Iterable[RunState | RunSummary]) -> str:
    """A short digest of what the page shows, so the script swaps it only when it changed."""
    digest = hashlib.sha256()
    for state in states:
        stamp = state.saved_at.isoformat() if state.saved_at else ""
        digest.update(f"{state.run_id}|{state.phase}|{stamp}\n".encode())
    return digest.hexdigest()[:16]


# -- runs ---------------------------------------------------------------------------------


def runs_page(
    page: Page, runs: Sequence[RunSummary], problems: Sequence[str], phase: str | None
) -> str:
    """The table of runs (from their summaries), optionally only those in one phase."""
    shown = [s for s in runs if phase is None or s.phase == phase]
    filters = ['<p class="filters">phase: ']
    for name in (None, *[str(p) for p in Phase]):
        label = name or "all"
        href = "/" if name is None else f"/?phase={quote(name)}"
        current = ' aria-current="page"' if name == phase else ""
        filters.append(f'<a href="{e(href)}"{current}>{e(label)}</a>')
    filters.append("</p>")
    rows = []
    for state in shown:
        waiting = len(state.questions)
        rows.append(
            "<tr>"
            f'<td><a href="/runs/{e(quote(state.run_id))}">{e(state.run_id)}</a></td>'
            f"<td>{_phase(state.phase)}</td>"
            f"<td>{state.turns}</td>"
            f"<td>${state.dollars:.4f}</td>"
            f"<td>{state.resumes}</td>"
            f"<td>{e(age(state.saved_at))}</td>"
            f"<td>{waiting if waiting else ''}</td>"
            "</tr>"
        )
    table = (
        "<table><thead><tr><th>run</th><th>phase</th><th>turns</th><th>dollars</th>"
        "<th>restarts</th><th>last saved</th><th>waiting questions</th></tr></thead>"
        f"<tbody>{''.join(rows) or '<tr><td colspan=7>no runs</td></tr>'}</tbody></table>"
    )
    broken = "".join(f'<div class="notice error">{e(p)}</div>' for p in problems)
    body = f"<h1>Runs</h1>{''.join(filters)}{broken}{table}"
    return _layout(page, "runs", body, version_of(shown) + str(len(problems)))


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
        head += (
            f'<div>run <a href="/runs/{e(quote(question.run_id))}">{e(question.run_id)}</a></div>'
        )
    why = f"<div>why a person: {e(question.why)}</div>" if question.why else ""
    args = f"<pre>{e(_pretty(question.arguments))}</pre>"
    return (
        f'<div class="question" id="q-{e(question.call_id)}" data-run="{e(question.run_id)}" '
        f'data-call="{e(question.call_id)}">{head}{why}{args}{_forms(page, question)}</div>'
    )


def _forms(page: Page, question: Question) -> str:
    if page.read_only:
        return '<div class="dim">read-only console: answer with `durably answer`</div>'
    if page.token is None:
        return (
            '<div class="dim">to answer, open the address the console printed at start '
            "(it carries the write token)</div>"
        )
    action = f"/runs/{e(quote(question.run_id))}/answer"
    hidden = (
        f'<input type="hidden" name="token" value="{e(page.token)}">'
        f'<input type="hidden" name="call" value="{e(question.call_id)}">'
    )
    if question.kind == "approve":
        return (
            f'<form method="post" action="{action}">{hidden}'
            '<button class="yes" name="answer" value="yes">approve</button></form>'
            f'<form method="post" action="{action}">{hidden}'
            '<input type="text" name="reason" placeholder="reason the model will see">'
            '<button class="no" name="answer" value="no">refuse</button></form>'
        )
    return (
        f'<form method="post" action="{action}">{hidden}'
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
    return _layout(page, "questions", body, version_of(waiting) + str(len(blocks)))


# -- one run ------------------------------------------------------------------------------


def _spend_chart(state: RunState) -> str:
    """Dollars spent after each turn, as a small inline SVG line."""
    points: list[tuple[int, float]] = [(0, 0.0)]
    total = 0.0
    for message in state.messages:
        if isinstance(message, AssistantMessage):
            total += message.dollars
            points.append((message.turn or len(points), total))
    if len(points) < 2:
        return '<p class="dim">no model reply yet</p>'
    width, height, pad = 480, 120, 24
    top = max(p[1] for p in points) or 1.0
    last = max(p[0] for p in points) or 1
    coords = " ".join(
        f"{pad + (width - 2 * pad) * turn / last:.1f},"
        f"{height - pad - (height - 2 * pad) * dollars / top:.1f}"
        for turn, dollars in points
    )
    note = "" if state.summarized == 0 else " (after the summary)"
    return (
        f'<svg class="spend" width="{width}" height="{height}" role="img" '
        f'aria-label="spend over turns">'
        f'<polyline fill="none" stroke="#0b3d91" stroke-width="2" points="{coords}"/>'
        f'<text x="{pad}" y="16" font-size="11">${top:.4f} after turn {last}{e(note)}</text>'
        f'<text x="{pad}" y="{height - 6}" font-size="11">turn 0</text></svg>'
    )


def _timeline(state: RunState) -> str:
    effects = {t.name: str(t.effect) for t in state.fingerprint.tools} if state.fingerprint else {}
    results: dict[str, ToolResult] = {
        m.call_id: m for m in state.messages if isinstance(m, ToolResult)
    }
    parts = []
    if state.summary:
        parts.append(
            f'<div class="turn"><div class="meta">summary of {state.summarized} earlier '
            f"messages</div><pre>{e(state.summary)}</pre></div>"
        )
    for message in state.messages:
        if isinstance(message, UserMessage):
            parts.append(
                f'<div class="turn"><div class="meta">user</div><pre>{e(message.text)}</pre></div>'
            )
        elif isinstance(message, AssistantMessage):
            calls = "".join(
                _call(state, c.id, c.name, c.arguments, effects, results) for c in message.calls
            )
            usage = message.usage
            parts.append(
                f'<div class="turn" id="turn-{message.turn}"><div class="meta">turn '
                f"{message.turn} · {e(message.model or '')} · {usage.input_tokens} in / "
                f"{usage.output_tokens} out · ${message.dollars:.4f}</div>"
                f'<pre class="reply">{e(message.text or "")}</pre>{calls}</div>'
            )
    return "".join(parts)


def _call(
    state: RunState,
    call_id: str,
    name: str,
    arguments: str,
    effects: Mapping[str, str],
    results: Mapping[str, ToolResult],
) -> str:
    effect = effects.get(name, "")
    marker = state.markers.get(call_id)
    lines = [
        f'<div><code>{e(name)}</code> <span class="effect-{e(effect)}">{e(effect)}</span> '
        f'<span class="dim">{e(call_id)} · key {e(idempotency_key(state.run_id, call_id))}'
        "</span></div>",
        _block(_pretty(arguments), label="arguments"),
    ]
    if marker is not None:
        lines.append(
            f"<div>attempt marker: started {e(marker.started_at.isoformat())} "
            "(the call may have acted)</div>"
        )
    resolution = state.resolutions.get(call_id)
    if resolution is not None:
        step = {1: "rerun (harmless)", 2: "lookup", 3: "a person"}.get(resolution.step, "")
        lines.append(
            f"<div>ladder: step {resolution.step} ({e(step)}) → {e(resolution.outcome)}"
            + (f" · {e(resolution.detail)}" if resolution.detail else "")
            + (f" · answered by {e(resolution.by)}" if resolution.by else "")
            + "</div>"
        )
    # approvals_given outlives the reply; decisions alone is what a checkpoint older than it has.
    decision = state.approvals_given.get(call_id) or state.decisions.get(call_id)
    if decision is not None:
        lines.append(f'<div class="approval">{_approval(decision)}</div>')
    pending = state.pending.get(call_id)
    if pending is not None:
        lines.append("<div><strong>waiting for a person</strong> (see the questions above)</div>")
    result = results.get(call_id)
    if result is not None:
        label = "error" if result.is_error else "result"
        lines.append(
            f'<div class="dim">{label}</div>' + _block(result.content, label=label, css="result")
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


def run_page(page: Page, state: RunState, checks: Sequence[FileCheck] | None) -> str:
    """One run: facts, open questions, spend, timeline, workspace files."""
    facts = [
        ("phase", _phase(state.phase)),
        ("task", f"<pre>{e(state.task.splitlines()[0][:300] if state.task else '-')}</pre>"),
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
        facts.append(("answer", f'<pre class="answer">{e(state.answer)}</pre>'))
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
        f"<h2>Timeline</h2>{_timeline(state)}"
        f"<h2>Workspace files</h2>{_files(checks)}"
    )
    return _layout(page, state.run_id, body, version_of([state]))


def error_page(page: Page, title: str, message: str) -> str:
    """A page that only says what went wrong."""
    body = f'<h1>{e(title)}</h1><div class="notice error" role="alert">{e(message)}</div>'
    return _layout(page, title, body, "error")
