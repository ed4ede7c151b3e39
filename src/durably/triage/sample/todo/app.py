"""Command-line front end: runs a script of commands against a fresh list.

One command per line::

    add TITLE [--due DATE] [--tag TAG]...
    rename ID TITLE
    due ID DATE
    done ID
    delete ID
    list
    export [--tag TAG] [--width N]
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterable

from .export import TITLE_WIDTH, export_table
from .store import NotFound, TodoList


def _split(words: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """Positional words, and the values of each ``--option VALUE``."""
    positional: list[str] = []
    options: dict[str, list[str]] = {}
    rest = iter(words)
    for word in rest:
        if word.startswith("--"):
            options.setdefault(word[2:], []).append(next(rest, ""))
        else:
            positional.append(word)
    return positional, options


def run_command(todos: TodoList, line: str) -> str:  # noqa: PLR0911 - the sample app's command table, one return per command
    """Run one command and return what it prints."""
    words = shlex.split(line)
    if not words:
        return ""
    name, (args, options) = words[0], _split(words[1:])
    due = options.get("due", [None])[-1]
    try:
        if name == "add":
            item = todos.add(args[0], due=due, tags=options.get("tag"))
            return f"added {item.id}: {item.title}"
        if name == "rename":
            item = todos.rename(int(args[0]), args[1])
            return f"renamed {item.id}: {item.title}"
        if name == "due":
            item = todos.set_due(int(args[0]), args[1])
            return f"due {item.id}: {item.due}"
        if name == "done":
            item = todos.mark_done(int(args[0]))
            return f"done {item.id}: {item.title}"
        if name == "delete":
            todos.delete(int(args[0]))
            return f"deleted {args[0]}"
        if name == "list":
            return "\n".join(f"{item.id}: {item.title}" for item in todos.pending())
        if name == "export":
            width = int(options.get("width", [str(TITLE_WIDTH)])[-1])
            return export_table(todos, tag=options.get("tag", [None])[-1], width=width)
    except NotFound as exc:
        return f"error: {exc}"
    return f"error: unknown command {name!r}"


def run_script(lines: Iterable[str]) -> list[str]:
    """Run commands in order against a fresh list; return what each printed."""
    todos = TodoList()
    outputs = []
    for line in lines:
        outputs.append(run_command(todos, line))
    return outputs


def main() -> int:
    """Read commands from standard input and print their output."""
    for output in run_script(sys.stdin):
        if output:
            print(output)
    return 0
