"""Listing runs by their summaries: what ``durably runs``, ``pending`` and the console show.

A :class:`RunSummary` is the part of a run's state that a list of runs shows:
its phase, turns, dollars, restarts, when it was created and last saved, and
the questions it waits for. :func:`list_runs` gives every run's summary, or the
reason it could not be read.

For a file store's directory the summaries come from the listing index beside
the runs (:mod:`durably.stores._index`): only runs whose files changed since the
index was written are loaded, and the index is rewritten when any were. It is a
cache and never more: whatever state the index is in, the listing is the one
that loading every run gives (:func:`list_runs_fully`, the benchmark's baseline
and the tests' oracle). On Postgres the summaries are the table's
summary columns, which every save writes (:func:`durably.postgres.fleet.list_summaries`;
a store with a ``summaries()`` method gives its own listing).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import msgspec

from .errors import DurablyError, RunNotFound
from .keys import idempotency_key
from .state import RunState, age
from .stores import Store, _index
from .stores.directory import DirectoryStore
from .stores.file import FileStore
from .stores.journal import JournalStore

__all__ = [
    "Listing",
    "Question",
    "RunSummary",
    "in_phase",
    "lease_text",
    "list_directory",
    "list_runs",
    "list_runs_fully",
    "phase_text",
    "plain",
    "questions",
    "render",
    "render_fleet",
    "select",
    "summarize",
    "table",
    "width",
]


@dataclass(frozen=True, kw_only=True)
class Question:
    """One open question of a paused run."""

    run_id: str
    call_id: str
    tool: str
    kind: str
    """``approve`` (may the call run?) or ``resolve`` (did this in-doubt call happen?)."""
    effect: str | None
    """The tool's effect as recorded when the run started (None for an old run without it)."""
    arguments: str
    key: str
    """The call's idempotency key."""
    asked_at: datetime
    started_at: datetime | None
    """For ``resolve``: when the attempt that may have acted started."""
    why: str | None
    """For ``resolve``: why the ladder could not decide by itself."""

    @property
    def answers(self) -> tuple[str, str]:
        """The two words that fit this question."""
        return ("yes", "no") if self.kind == "approve" else ("rerun", "done")


def questions(state: RunState) -> list[Question]:
    """The questions ``state`` waits for, in the order of the reply's calls."""
    effects = {t.name: str(t.effect) for t in state.fingerprint.tools} if state.fingerprint else {}
    order = {call.id: n for n, call in enumerate(state.unanswered())}
    found = []
    for pending in sorted(state.pending.values(), key=lambda p: order.get(p.call_id, len(order))):
        marker = state.markers.get(pending.call_id)
        found.append(
            Question(
                run_id=state.run_id,
                call_id=pending.call_id,
                tool=pending.tool,
                kind=pending.kind,
                effect=effects.get(pending.tool),
                arguments=pending.arguments,
                key=marker.key if marker else idempotency_key(state.run_id, pending.call_id),
                asked_at=pending.asked_at,
                started_at=marker.started_at if marker else None,
                why=pending.why,
            )
        )
    return found


class RunSummary(msgspec.Struct, frozen=True, kw_only=True):
    """What a list of runs shows of one run, without the rest of its state."""

    run_id: str
    phase: str
    turns: int
    dollars: float
    resumes: int
    """Restarts: how many times the run was resumed after it started."""
    created_at: datetime
    saved_at: datetime | None
    questions: tuple[Question, ...] = ()
    """The questions the run waits for (empty unless it is paused for a person)."""
    agent: str | None = None
    """The registered agent a Postgres worker runs it with (None: not submitted)."""
    owner: str | None = None
    """The process named in its Postgres lease, live or not (None: never claimed)."""
    lease_left: float | None = None
    """Seconds until its Postgres lease expires, by the database clock; negative: it
    expired that long ago; None: no lease (queued, handed back, or a file store)."""
    parked: str | None = None
    """Why a worker parked it (no worker claims it until a person resumes it)."""

    @property
    def claimed(self) -> bool:
        """Whether a live lease holds it (a worker is on it)."""
        return self.lease_left is not None and self.lease_left > 0


_summary_decoder = msgspec.json.Decoder(RunSummary)
_summary_encoder = msgspec.json.Encoder()


def summarize(state: RunState) -> RunSummary:
    """The summary of a loaded state."""
    return RunSummary(
        run_id=state.run_id,
        phase=str(state.phase),
        turns=state.turns,
        dollars=state.dollars,
        resumes=state.resumes,
        created_at=state.created_at,
        saved_at=state.saved_at,
        questions=tuple(questions(state)) if state.pending else (),
    )


@dataclass
class Listing:
    """Every run of a store: the summaries of those that could be read, and the others."""

    summaries: list[RunSummary] = field(default_factory=list)
    """Sorted by run ID."""
    unreadable: list[tuple[str, DurablyError]] = field(default_factory=list)
    """Runs that could not be read, with the reason (sorted by run ID)."""
    loaded: int = 0
    """How many runs were loaded whole (the rest came from the index)."""


def list_directory(store: FileStore) -> Listing:
    """Every run in a file store's directory, through the listing index.

    Runs of either file store are read (through a ``JournalStore`` of its own over
    the same directory: a snapshot ``FileStore`` refuses journal runs).

    Raises:
        UnsafePath: the directory is not the user's own (as for any other read).
    """
    if not os.path.lexists(store.directory):
        return Listing()  # a reader never creates the state directory
    # A reader of its own: read_listed_sync is not for a store others read through.
    reader = JournalStore(store.directory, fs=store.fs, allow_network_fs=store.allow_network_fs)
    try:
        return _list_directory(reader)
    finally:
        reader.close_sync()


def _list_directory(store: JournalStore) -> Listing:
    started = time.time_ns()
    # The identities are taken before anything is read: see stores/_index.py.
    current = _index.scan(store)
    known = _index.load(store)
    listing = Listing()
    recorded: dict[str, tuple[_index.Identity, bytes]] = {}
    for run_id in sorted(current):
        identity = current[run_id]
        entry = known.get(run_id)
        if entry is not None and entry[0] == identity:
            try:
                listing.summaries.append(_summary_decoder.decode(entry[1]))
                recorded[run_id] = (identity, bytes(entry[1]))
                continue
            except msgspec.DecodeError:
                pass  # an entry this version cannot read: load the run
        try:
            state = store.read_listed_sync(run_id, [name for name, *_ in identity])
        except RunNotFound:
            continue  # removed since the directory was listed
        except DurablyError as exc:
            listing.unreadable.append((run_id, exc))
            continue
        listing.loaded += 1
        summary = summarize(state)
        listing.summaries.append(summary)
        if _index.settled(identity, started_ns=started):
            recorded[run_id] = (identity, _summary_encoder.encode(summary))
    if recorded.keys() != known.keys() or any(
        known[run][0] != recorded[run][0] for run in recorded
    ):
        _index.save(store, recorded)
    return listing


async def list_runs(store: Store) -> Listing:
    """Every run of ``store``: through the listing index for a file store, else loading each."""
    if isinstance(store, DirectoryStore):
        store = store._journal  # noqa: SLF001 -- its journal store reads both layouts
    if isinstance(store, FileStore):
        import asyncio  # only where a loop runs (start-up stays light)

        return await asyncio.to_thread(list_directory, store)
    summaries = getattr(store, "summaries", None)
    if summaries is not None:  # Postgres: its summary columns, queued runs too
        listed: Listing = await summaries()
        return listed
    return await list_runs_fully(store)


async def list_runs_fully(store: Store) -> Listing:
    """Every run of ``store``, each loaded whole (Postgres; and the index's oracle)."""
    listing = Listing()
    for run_id in await store.list_runs():
        try:
            state = await store.read(run_id)
        except RunNotFound:
            continue  # queued on Postgres (no state yet), or removed since the listing
        except DurablyError as exc:
            listing.unreadable.append((run_id, exc))
            continue
        listing.loaded += 1
        listing.summaries.append(summarize(state))
    return listing


def select(
    summaries: Iterable[RunSummary],
    *,
    phase: str | None = None,
    sort: str = "saved",
    limit: int | None = None,
) -> list[RunSummary]:
    """The runs to show: in ``phase`` only, newest save first (or by run ID), at most ``limit``.

    Args:
        summaries: the runs.
        phase: keep only runs in this phase (None: all).
        sort: ``saved`` (last saved first; never-saved runs last) or ``run`` (by run ID).
        limit: at most this many, after sorting (None: all).
    """
    chosen = [s for s in summaries if phase is None or in_phase(s, phase)]
    if sort == "saved":
        chosen.sort(key=lambda s: s.run_id)
        chosen.sort(key=_saved_key, reverse=True)
    elif sort == "run":
        chosen.sort(key=lambda s: s.run_id)
    else:
        raise ValueError(f"unknown sort {sort!r}: sort by saved or run")
    return chosen if limit is None else chosen[:limit]


def in_phase(summary: RunSummary, phase: str) -> bool:
    """Whether ``summary`` is in ``phase``.

    A state phase, ``queued``, ``parked`` (parked by a worker, in any phase) or
    ``claimed`` (a live lease holds it).
    """
    if phase == "parked":
        return summary.parked is not None
    if phase == "claimed":
        return summary.claimed
    return summary.phase == phase


def _saved_key(summary: RunSummary) -> tuple[bool, float]:
    saved = summary.saved_at
    return (saved is not None, saved.timestamp() if saved is not None else 0.0)


_COLUMNS = ("run", "phase", "turns", "dollars", "restarts", "last saved")
_RIGHT = frozenset({"turns", "dollars"})


def render(
    summaries: Sequence[RunSummary],
    unreadable: Sequence[str] = (),
    *,
    title: str,
    color: bool = False,
) -> str:
    """The runs as a text table, drawn as the other commands' tables are (rich's heavy head).

    Drawn here rather than by rich: rich lays out 10,000 rows in about ten
    seconds, and a listing of that many must take well under one. Cells are never
    cut (a run ID is copied into other commands), so a narrow terminal wraps lines.

    Args:
        summaries: the runs to show, in order.
        unreadable: run IDs that could not be read, shown last as ``unreadable``.
        title: the line above the table.
        color: mark unreadable runs red (ANSI), for a terminal.
    """
    rows = [
        (
            s.run_id,
            s.phase,
            str(s.turns),
            f"${s.dollars:.4f}",
            str(s.resumes),
            age(s.saved_at),
        )
        for s in summaries
    ]
    rows += [(run, "unreadable", "-", "-", "-", "-") for run in unreadable]
    red = {n for n, r in enumerate(rows) if color and r[1] == "unreadable"}
    return table(_COLUMNS, rows, title=title, right=_RIGHT, red=(red, 1))


_FLEET_COLUMNS = (
    "run",
    "phase",
    "agent",
    "owner",
    "lease",
    "turns",
    "dollars",
    "restarts",
    "age",
    "last saved",
)


def lease_text(summary: RunSummary) -> str:
    """The lease column: ``expires in 12s``, ``expired 3s ago`` or ``-`` (no lease)."""
    left = summary.lease_left
    if left is None:
        return "-"
    return f"expires in {_span(left)}" if left > 0 else f"expired {_span(-left)} ago"


def _span(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


def phase_text(summary: RunSummary) -> str:
    """The phase column of a fleet table: the phase, and ``parked`` when a worker parked it."""
    return f"{summary.phase}, parked" if summary.parked is not None else summary.phase


def render_fleet(
    summaries: Sequence[RunSummary],
    unreadable: Sequence[str] = (),
    *,
    title: str,
    color: bool = False,
) -> str:
    """:func:`render` for a Postgres store: with each run's agent, owner and lease, and age.

    The owner is shown while the lease is live or expired-but-not-yet-taken
    (``lease`` says which); a run handed back shows its last owner with no lease.
    """
    rows: list[tuple[str, ...]] = [
        (
            s.run_id,
            phase_text(s),
            s.agent or "-",
            s.owner or "-",
            lease_text(s),
            str(s.turns),
            f"${s.dollars:.4f}",
            str(s.resumes),
            age(s.created_at),
            age(s.saved_at),
        )
        for s in summaries
    ]
    rows += [(run, "unreadable", *["-"] * 8) for run in unreadable]
    red = {n for n, r in enumerate(rows) if color and r[1] == "unreadable"}
    return table(_FLEET_COLUMNS, rows, title=title, right=_RIGHT, red=(red, 1))


_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Control characters other than tab and newline: a terminal would act on them."""


def plain(text: str) -> str:
    r"""``text`` safe to print: control characters (an escape sequence) written as ``\xNN``."""
    return _UNSAFE.sub(lambda m: f"\\x{ord(m.group()):02x}", text.expandtabs(4))


def width(text: str) -> int:
    """The columns ``text`` takes on a terminal: wide characters take two, combining none."""
    if text.isascii():
        return len(text)
    import unicodedata

    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
        for c in text
    )


def table(
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    title: str | None = None,
    right: frozenset[str] = frozenset(),
    red: tuple[set[int], int] = (set(), 0),
) -> str:
    """Rows as a text table with a heavy head, as rich draws one, without loading rich.

    Cells are never cut (an ID is copied into other commands): a narrow terminal
    wraps lines. A cell's lines stack in its row; control characters are escaped
    (:func:`plain`). ``right``: columns aligned right; ``red``: (rows, column) whose
    cells are marked red with ANSI.
    """
    cells = [[plain(cell).split("\n") for cell in row] for row in rows]
    widths = [
        max([width(c), *(width(line) for row in cells for line in row[n])])
        for n, c in enumerate(columns)
    ]

    def line(texts: Sequence[str], edge: str, middle: str, red_at: int = -1) -> str:
        parts = []
        for n, (text, wide) in enumerate(zip(texts, widths, strict=True)):
            pad = " " * (wide - width(text))
            text = pad + text if columns[n] in right else text + pad
            if n == red_at:
                text = f"\x1b[31m{text}\x1b[0m"
            parts.append(f" {text} ")
        return edge + middle.join(parts) + edge

    def rule(left: str, fill: str, cross: str, right: str) -> str:
        return left + cross.join(fill * (w + 2) for w in widths) + right

    out = [] if title is None else [plain(title)]
    out += [rule("┏", "━", "┳", "┓"), line(columns, "┃", "┃"), rule("┡", "━", "╇", "┩")]
    for r, row in enumerate(cells):
        for k in range(max(len(lines) for lines in row)):
            texts = [lines[k] if k < len(lines) else "" for lines in row]
            out.append(line(texts, "│", "│", red[1] if r in red[0] else -1))
    out.append(rule("└", "─", "┴", "┘"))
    return "\n".join(out) + "\n"
