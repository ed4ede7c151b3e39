"""The building blocks every console page is made of: escaping, cut text, the shared layout.

Text from the model, the tools and the task reaches the page only through :func:`e`
(``html.escape`` with quotes). A text longer than :data:`SHOWN` characters is cut by
:func:`pre`, with a link to the whole of it. :mod:`.pages` assembles the pages from these.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from urllib.parse import quote

from ..state import Phase

SHOWN = 20_000
"""Characters of one text a page shows before the link to the whole: pages more than a
screenful of text each are read through the link, and a 100 MB reply rendered whole
took 23 s and 210 MB of HTML per poll (issue 31)."""


def e(text: object) -> str:
    """``text`` escaped for HTML, quotes included."""
    return html.escape(str(text), quote=True)


def pretty(arguments: str) -> str:
    """JSON ``arguments`` indented; other text as it is."""
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except ValueError:
        return arguments


def pre(text: str, *, whole: str, css: str = "") -> str:
    """Text in a ``<pre>``, cut at :data:`SHOWN` characters with a link to the whole (``whole``)."""
    attribute = f' class="{css}"' if css else ""
    if len(text) <= SHOWN:
        return f"<pre{attribute}>{e(text)}</pre>"
    rest = len(text) - SHOWN
    return (
        f"<pre{attribute}>{e(text[:SHOWN])}</pre>"
        f'<p class="cut dim">… {rest:,} more characters: '
        f'<a href="{e(whole)}">the whole text</a></p>'
    )


def block(text: str, *, label: str, whole: str, css: str = "") -> str:
    """Text in a ``<pre>``; long text folded in a ``<details>`` that opens on a click."""
    head = text[: SHOWN + 1]  # a line count of the part shown, not of 100 MB
    lines = head.splitlines()
    if len(lines) <= 8 and len(text) <= 600:
        return pre(text, whole=whole, css=css)
    first = (lines[0] if lines else "")[:120]
    count = (
        f"{len(lines)} line{'' if len(lines) == 1 else 's'}"
        if len(text) <= SHOWN
        else f"{len(text):,} characters"
    )
    return (
        f'<details><summary><code>{e(first)}</code> <span class="dim">… {e(label)}, '
        f"{count}</span></summary>{pre(text, whole=whole, css=css)}</details>"
    )


def shown_arguments(arguments: str) -> str:
    """Arguments as the page shows them: pretty JSON, unless too long to show whole anyway."""
    return pretty(arguments) if len(arguments) <= SHOWN else arguments


def whole_link(page: Page, run_id: str, part: str) -> str:
    """The link to the whole of one cut text of a run (see :func:`.pages.whole_text`)."""
    return f"{page.root}runs/{quote(run_id, safe='')}/text?part={quote(part, safe='')}"


def phase_badge(phase: Phase | str) -> str:
    """A run's phase as a coloured label."""
    return f'<span class="phase phase-{e(phase)}">{e(phase)}</span>'


@dataclass(frozen=True, kw_only=True)
class Page:
    """What every page shares: the store's name, the root of every link, whether forms show."""

    store: str
    root: str
    """The start of every link: ``/t/<token>/`` (the token is the address's)."""
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


def layout(page: Page, title: str, body: str, version: str) -> str:
    """A whole HTML document: the header every page shares, ``body``, and the one script."""
    root = e(page.root)
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
        f'<link rel="stylesheet" href="{root}static/console.css"></head><body>'
        f'<header><strong>durably</strong><a href="{root}">runs</a>'
        f'<a href="{root}questions">questions</a>'
        f'<span class="store">{e(page.store)}'
        f"{' · read-only' if page.read_only else ''}</span></header>"
        f'<main data-version="{e(version)}">{notices}{body}</main>'
        f'<script src="{root}static/console.js"></script></body></html>'
    )
