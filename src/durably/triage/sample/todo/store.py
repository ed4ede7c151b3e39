"""The to-do list: items with stable ids, kept in display order."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from .dates import parse_due
from .text import normalize_title, slugify


class NotFound(LookupError):
    """Raised for an item id the list does not hold."""

    def __init__(self, item_id: int) -> None:
        super().__init__(f"no item {item_id}")
        self.item_id = item_id


@dataclass
class Item:
    """One thing to do."""

    id: int
    title: str
    done: bool = False
    due: datetime | None = None
    tags: list[str] = field(default_factory=list)


class TodoList:
    """Items by id, shown in the order they were added; done items move to the end."""

    def __init__(self) -> None:
        self._items: dict[int, Item] = {}
        self._order: list[int] = []
        self._next_id = 1

    def add(self, title: str, *, due: str | None = None, tags: list[str] | None = None) -> Item:
        """Add an item at the end of the list and return it."""
        item = Item(id=self._next_id, title=normalize_title(title))
        if due is not None:
            item.due = parse_due(due)
        item.tags = [slugify(tag) for tag in tags or []]
        self._items[item.id] = item
        self._order.append(item.id)
        self._next_id += 1
        return item

    def get(self, item_id: int) -> Item:
        """The item with this id; raises NotFound."""
        try:
            return self._items[item_id]
        except KeyError:
            raise NotFound(item_id) from None

    def rename(self, item_id: int, title: str) -> Item:
        """Give an item a new title; raises NotFound."""
        item = self.get(item_id)
        item.title = normalize_title(title)
        return item

    def set_due(self, item_id: int, due: str) -> Item:
        """Set an item's due date from ISO 8601 text; raises NotFound."""
        item = self.get(item_id)
        item.due = parse_due(due)
        return item

    def mark_done(self, item_id: int) -> Item:
        """Mark an item done and move it to the end of the list; raises NotFound."""
        if item_id not in self._order:
            raise NotFound(item_id)
        self._order.remove(item_id)
        self._order.append(item_id)
        item = self._items[item_id]
        item.done = True
        return item

    def delete(self, item_id: int) -> None:
        """Remove an item for good; raises NotFound."""
        if item_id not in self._items:
            raise NotFound(item_id)
        del self._items[item_id]

    def items(self, *, tag: str | None = None) -> list[Item]:
        """The items in display order, only those with ``tag`` if given."""
        chosen = [self._items[item_id] for item_id in self._order]
        if tag is not None:
            wanted = slugify(tag)
            chosen = [item for item in chosen if wanted in item.tags]
        return chosen

    def pending(self) -> list[Item]:
        """The items not yet done, in display order."""
        return [item for item in self.items() if not item.done]
