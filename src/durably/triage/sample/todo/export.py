"""Plain-text export: a fixed-width table and a progress line, for printing or e-mail."""

from __future__ import annotations

from .dates import format_due
from .store import TodoList
from .text import truncate

TITLE_WIDTH = 24


def export_table(todos: TodoList, *, tag: str | None = None, width: int = TITLE_WIDTH) -> str:
    """The list as text: one line per item, then how much of it is done."""
    rows = todos.items(tag=tag)
    lines = []
    for item in rows:
        mark = "x" if item.done else " "
        title = truncate(item.title, width)
        lines.append(f"[{mark}] {item.id:>3}  {title:<{width}}  {format_due(item.due)}".rstrip())
    done = sum(1 for item in rows if item.done)
    percent = done * 100 // len(rows)
    lines.append(f"{done}/{len(rows)} done ({percent}%)")
    return "\n".join(lines)
