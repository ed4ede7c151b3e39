"""Text helpers: titles, tags, and truncation for the fixed-width export."""

ELLIPSIS = "..."


def normalize_title(title: str) -> str:
    """Collapse runs of whitespace and capitalise the first letter.

    >>> normalize_title("  buy   oat milk ")
    'Buy oat milk'
    """
    text = " ".join(title.split())
    return text[0].upper() + text[1:]


def slugify(tag: str) -> str:
    """A tag as lower-case words joined by hyphens: ``"Home Office"`` -> ``"home-office"``."""
    return "-".join(tag.lower().split())


def truncate(text: str, limit: int) -> str:
    """Cut text so that its UTF-8 encoding fits in ``limit`` bytes, ending with an ellipsis.

    The export is read by a printer with fixed-width byte columns, so the limit
    counts bytes, not characters.
    """
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[: limit - len(ELLIPSIS)].decode("utf-8") + ELLIPSIS
