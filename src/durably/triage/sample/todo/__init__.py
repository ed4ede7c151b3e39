"""todo: a small to-do list library with due dates, tags and a plain-text export."""

from .dates import format_due, parse_due
from .export import export_table
from .store import Item, NotFound, TodoList
from .text import normalize_title, slugify, truncate

__all__ = [
    "Item",
    "NotFound",
    "TodoList",
    "export_table",
    "format_due",
    "normalize_title",
    "parse_due",
    "slugify",
    "truncate",
]

__version__ = "1.4.2"
