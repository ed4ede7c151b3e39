"""KeyTable: the receiver's keys in a caller's own SQLite database, in the caller's transaction."""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path

from durably.receivers import (
    Claimed,
    IdempotencyStore,
    KeyState,
    KeyTable,
    Mismatch,
    Replay,
    StoredOutcome,
)

TTL = timedelta(hours=1)


class Clock:
    """A clock that stands still until a test moves it."""

    def __init__(self) -> None:
        self.now = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        """The time it shows."""
        return self.now


def connect(path: Path) -> sqlite3.Connection:
    """An autocommit connection, so each test's transactions are explicit."""
    return sqlite3.connect(path, isolation_level=None)


def test_a_claim_rolled_back_with_the_callers_work_leaves_the_key_free(tmp_path: Path) -> None:
    """The claim lives in the caller's transaction: a rollback takes it back, a commit keeps
    the key and its result, replayed to the same request and refused to another.
    """
    clock = Clock()
    with closing(connect(tmp_path / "service.db")) as db:
        keys = KeyTable(db, ttl=TTL, clock=clock)
        keys.create()
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        db.execute("BEGIN IMMEDIATE")
        claim = keys.claim("k-1", "fp")
        assert isinstance(claim, Claimed)
        db.execute("INSERT INTO orders DEFAULT VALUES")
        db.execute("ROLLBACK")  # the work failed: neither the order nor the key remain
        assert keys.record("k-1").state is KeyState.UNKNOWN
        db.execute("BEGIN IMMEDIATE")
        claim = keys.claim("k-1", "fp")
        assert isinstance(claim, Claimed)
        db.execute("INSERT INTO orders DEFAULT VALUES")
        assert keys.finish(claim, StoredOutcome(value={"order": 1}))
        db.execute("COMMIT")
        assert db.execute("SELECT count(*) FROM orders").fetchone() == (1,)
        again = keys.claim("k-1", "fp")
        assert isinstance(again, Replay)
        assert again.result == StoredOutcome(value={"order": 1})
        assert isinstance(keys.claim("k-1", "another request"), Mismatch)


def test_the_store_and_the_table_are_one_format(tmp_path: Path) -> None:
    """A key finished through KeyTable is a done key to IdempotencyStore on the same file."""
    path = tmp_path / "keys.sqlite3"
    store = IdempotencyStore(path, ttl=TTL)
    with closing(connect(path)) as db:
        keys = KeyTable(db, ttl=TTL)
        db.execute("BEGIN IMMEDIATE")
        claim = keys.claim("k-1", "fp")
        assert isinstance(claim, Claimed)
        keys.finish(claim, StoredOutcome(value="done"))
        db.execute("COMMIT")
    record = asyncio.run(store.record("k-1"))
    store.close()
    assert record.state is KeyState.DONE
    assert record.result == StoredOutcome(value="done")


def test_forgetting_expired_keys_drops_their_tombstones_and_keeps_live_keys(
    tmp_path: Path,
) -> None:
    """forget_expired deletes keys older than the TTL (a lookup then finds nothing), no other."""
    clock = Clock()
    with closing(connect(tmp_path / "service.db")) as db:
        keys = KeyTable(db, ttl=TTL, clock=clock)
        keys.create()
        for key in ("old-1", "old-2", "new"):
            if key == "new":
                clock.now += TTL
            claim = keys.claim(key, "fp")
            assert isinstance(claim, Claimed)
            keys.finish(claim, StoredOutcome(value=key))
        assert keys.record("old-1").state is KeyState.EXPIRED
        assert keys.forget_expired() == 2
        assert keys.record("old-1").state is KeyState.UNKNOWN
        assert keys.record("new").state is KeyState.DONE
