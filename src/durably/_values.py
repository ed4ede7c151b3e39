"""Checks for values that user code hands to durably, before any of them is saved.

A checkpoint durably wrote must always load again (docs/concepts.md), so text
entering the state must be a ``str`` that UTF-8 can encode: Python strings may
hold lone surrogates (from ``os.fsdecode``, ``surrogateescape`` or a careless
slice of UTF-16), which JSON encoders refuse. These helpers say whether a value
fits and describe it for an error message without copying a huge value.
"""

from __future__ import annotations

import reprlib

__all__ = ["describe", "escaped", "exception_text", "text_problem"]

_SHOWN = 80
"""Characters of a value shown in an error message."""

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = _SHOWN
_repr.maxlevel = 3
# Bounded, so a huge string or a deeply nested dict is described without being copied whole.


def text_problem(value: object) -> str | None:
    """Why ``value`` cannot be stored as text, or None when it can."""
    if not isinstance(value, str):
        return f"expected str, got {describe(value)}"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"the text holds {value[exc.start]!r} at position {exc.start}, "
            "a lone surrogate that UTF-8 (and so JSON) cannot encode"
        )
    return None


def escaped(text: str) -> str:
    r"""``text`` with every lone surrogate written as a ``\udXXX`` escape, so it can be stored.

    Used for messages durably writes itself (an exception's text, a lookup's
    failure), where losing a character is better than refusing the message.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def describe(value: object) -> str:
    """The value's type and the start of its ``repr``, safe to store and to print."""
    try:
        shown = _repr.repr(value)
    except Exception as exc:  # noqa: BLE001 - a user object whose __repr__ raises still gets named
        shown = f"<unrepresentable: {type(exc).__name__}>"
    if len(shown) > _SHOWN:
        shown = shown[: _SHOWN - 3] + "..."
    return f"{type(value).__name__} {escaped(shown)}"


_ERROR_CHARS = 20_000
"""An exception's text longer than this is cut: it is for the model to read, not an archive."""


def exception_text(exc: BaseException) -> str:
    """``Type: message`` for an exception from user code, always storable.

    Its ``str()`` may raise (a deeply nested argument, a ``__str__`` that fails) or
    hold lone surrogates; neither may stop the run that reports it.
    """
    try:
        message = str(exc)
    except Exception as failure:  # noqa: BLE001 - any str() may raise; the report must still be made
        message = f"<the message could not be shown: {type(failure).__name__}>"
    if len(message) > _ERROR_CHARS:
        message = message[:_ERROR_CHARS] + f"... ({len(message) - _ERROR_CHARS} more characters)"
    return escaped(f"{type(exc).__name__}: {message}")
