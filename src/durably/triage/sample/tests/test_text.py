"""Tests of the text helpers."""

from todo.text import normalize_title, slugify, truncate


def test_normalize_title() -> None:
    assert normalize_title("  buy   oat milk ") == "Buy oat milk"


def test_slugify() -> None:
    assert slugify("Home  Office") == "home-office"


def test_truncate_counts_bytes() -> None:
    assert truncate("short", 10) == "short"
    assert truncate("a rather long title", 10) == "a rathe..."
    assert truncate("café", 10) == "café"
