"""Seeded flaws of the journal store's protocol, shared by the tests that must catch them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

from durably.stores.journal import JournalRun


@contextmanager
def no_datasync() -> Iterator[None]:
    """Appends that skip their fdatasync: written to the page cache, never flushed."""
    original = JournalRun._append

    def append(self: JournalRun, record: bytes) -> None:
        sync, self._journal.sync = self._journal.sync, False
        try:
            original(self, record)
        finally:
            self._journal.sync = sync

    with mock.patch.object(JournalRun, "_append", append):
        yield
