"""Tests of the to-do list itself."""

from todo import NotFound, TodoList


def test_add_gives_increasing_ids() -> None:
    todos = TodoList()
    first = todos.add("buy milk")
    second = todos.add("walk the dog")
    assert (first.id, second.id) == (1, 2)
    assert [item.title for item in todos.items()] == ["Buy milk", "Walk the dog"]


def test_mark_done_moves_item_to_the_end() -> None:
    todos = TodoList()
    todos.add("one")
    todos.add("two")
    todos.mark_done(1)
    assert [item.id for item in todos.items()] == [2, 1]
    assert [item.id for item in todos.pending()] == [2]


def test_unknown_ids_raise_not_found() -> None:
    todos = TodoList()
    for action in (todos.get, todos.mark_done, todos.delete):
        try:
            action(7)
        except NotFound as exc:
            missing = exc.item_id
        else:
            raise AssertionError(f"{action.__name__}(7) did not raise NotFound")
        assert missing == 7


def test_delete_forgets_the_item() -> None:
    todos = TodoList()
    item = todos.add("call the bank")
    todos.delete(item.id)
    try:
        todos.get(item.id)
    except NotFound:
        pass
    else:
        raise AssertionError("a deleted item is still there")


def test_tags_filter_items() -> None:
    todos = TodoList()
    todos.add("file taxes", tags=["Home Office"])
    todos.add("buy milk", tags=["errands"])
    assert [item.title for item in todos.items(tag="home office")] == ["File taxes"]


def test_rename_normalizes_the_title() -> None:
    todos = TodoList()
    item = todos.add("draft")
    todos.rename(item.id, "  write   the report ")
    assert todos.get(item.id).title == "Write the report"
