"""Tests of the plain-text export and the command-line front end."""

from todo import TodoList, export_table
from todo.app import run_script


def test_export_lists_items_and_progress() -> None:
    todos = TodoList()
    todos.add("pay rent", due="2026-03-01T09:00:00+00:00")
    todos.add("an extremely long title that will not fit")
    todos.mark_done(1)
    lines = export_table(todos, width=12).splitlines()
    assert lines == [
        "[ ]   2  An extrem...",
        "[x]   1  Pay rent      2026-03-01 09:00",
        "1/2 done (50%)",
    ]


def test_script_runs_commands_in_order() -> None:
    outputs = run_script(["add 'buy milk' --tag errands", "add 'walk dog'", "done 1", "list"])
    assert outputs == ["added 1: Buy milk", "added 2: Walk dog", "done 1: Buy milk", "2: Walk dog"]


def test_script_reports_unknown_ids() -> None:
    assert run_script(["done 4"]) == ["error: no item 4"]
