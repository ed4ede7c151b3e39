"""The tracker: idempotency keys with Stripe's semantics, the refile guard, lookups, audit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import msgspec
import pytest

from _helpers.patience import stretched
from durably.triage.tracker import (
    AlreadyFiled,
    FiledIssue,
    InvalidRequest,
    IssueNotFound,
    KeyConflict,
    MovableClock,
    Tracker,
    normalize_cause,
)

TTL = timedelta(hours=24)


@pytest.fixture
def clock() -> MovableClock:
    """The tracker's clock, standing still until a test moves it."""
    return MovableClock()


@pytest.fixture
def tracker(tmp_path: Path, clock: MovableClock) -> Tracker:
    """A tracker that honours keys, on a fresh database."""
    return Tracker(tmp_path / "tracker.db", key_ttl=TTL, clock=clock)


def file_done_after_delete(
    tracker: Tracker, *, key: str | None, title: str = "Crash"
) -> FiledIssue:
    """File the m1 issue with the given key."""
    return tracker.file_issue(
        title=title,
        body="mark_done after delete raises KeyError",
        cause="done-after-delete",
        reports=["CR-1042", "CR-1044"],
        key=key,
    )


def test_repeat_with_same_key_returns_first_response_and_acts_once(tracker: Tracker) -> None:
    """A repeat with the same key and arguments returns the first answer, replayed, acting once."""
    first = file_done_after_delete(tracker, key="k-1")
    again = file_done_after_delete(tracker, key="k-1")
    assert not first.replayed
    assert again.replayed
    assert msgspec.structs.replace(again, replayed=False) == first
    assert [effect.kind for effect in tracker.effects()] == ["issue"]
    assert [request.outcome for request in tracker.requests()] == ["created", "replayed"]


def test_same_key_with_different_arguments_is_a_conflict(tracker: Tracker) -> None:
    """The same key with different arguments is refused with KeyConflict and does nothing."""
    file_done_after_delete(tracker, key="k-1")
    with pytest.raises(KeyConflict) as caught:
        file_done_after_delete(tracker, key="k-1", title="Another title")
    assert caught.value.key == "k-1"
    with pytest.raises(KeyConflict):
        tracker.comment(number=1, body="a comment under an issue's key", key="k-1")
    assert len(tracker.effects()) == 1
    assert [request.outcome for request in tracker.requests()][1:] == [
        "key_conflict",
        "key_conflict",
    ]


def test_expired_key_counts_as_no_key_for_comments(tracker: Tracker, clock: MovableClock) -> None:
    """A key older than the TTL no longer deduplicates: the repeat acts again."""
    issue = file_done_after_delete(tracker, key="k-1")
    tracker.comment(number=issue.number, body="Also seen in CR-1047", key="c-1")
    clock.advance(TTL - timedelta(seconds=1))
    assert tracker.comment(number=issue.number, body="Also seen in CR-1047", key="c-1").replayed
    clock.advance(timedelta(seconds=2))
    late = tracker.comment(number=issue.number, body="Also seen in CR-1047", key="c-1")
    assert not late.replayed
    assert len(tracker.comments(issue.number)) == 2
    assert [effect.kind for effect in tracker.effects()] == ["issue", "comment", "comment"]


def test_expired_key_on_a_filing_meets_the_refile_guard(
    tracker: Tracker, clock: MovableClock
) -> None:
    """A filing repeated after its key expired is refused by the refile guard, naming the issue."""
    issue = file_done_after_delete(tracker, key="k-1")
    clock.advance(TTL + timedelta(minutes=1))
    with pytest.raises(AlreadyFiled) as caught:
        file_done_after_delete(tracker, key="k-1")
    assert caught.value.number == issue.number
    assert len(tracker.issues()) == 1


def test_refile_guard_refuses_a_second_filing_of_a_cause(tracker: Tracker) -> None:
    """A new filing for a cause already filed is refused with the existing issue's number."""
    tracker.file_issue(title="Other", body="b", cause="empty-title", reports=["CR-1043"], key="a")
    issue = file_done_after_delete(tracker, key="k-1")
    with pytest.raises(AlreadyFiled, match=f"#{issue.number}") as caught:
        tracker.file_issue(
            title="Same bug, other words",
            body="KeyError in mark_done",
            cause="Done After Delete",
            reports=["CR-1047"],
            key="k-2",
        )
    assert caught.value.number == issue.number == 2
    assert len(tracker.issues()) == 2
    assert tracker.requests()[-1].outcome == "already_filed"


def test_ignored_keys_make_visible_duplicates(tmp_path: Path) -> None:
    """A tracker that ignores keys acts on every repeat, recording the key it was sent each time."""
    tracker = Tracker(tmp_path / "tracker.db", honour_keys=False)
    issue = file_done_after_delete(tracker, key="k-1")
    first = tracker.comment(number=issue.number, body="Fixed by patch", key="c-1")
    second = tracker.comment(number=issue.number, body="Fixed by patch", key="c-1")
    assert first.id != second.id
    assert not second.replayed
    assert [comment.key for comment in tracker.comments()] == ["c-1", "c-1"]
    assert tracker.get(issue.number).key == "k-1"
    with pytest.raises(AlreadyFiled):
        file_done_after_delete(tracker, key="k-1")
    assert tracker.lookup("k-1") is None


def test_lookup_finds_a_processed_key_and_only_that(tracker: Tracker, clock: MovableClock) -> None:
    """Lookup returns the stored answer for a processed key, and None for a key never seen."""
    issue = file_done_after_delete(tracker, key="k-1")
    comment = tracker.comment(number=issue.number, body="note", key="c-1")
    found = tracker.lookup("k-1")
    assert found is not None
    assert found["kind"] == "issue"
    assert found["number"] == issue.number
    assert found["replayed"] is False
    assert tracker.lookup("c-1") == {"kind": "comment", **msgspec.to_builtins(comment)}
    assert tracker.lookup("never-sent") is None
    clock.advance(TTL * 2)
    assert tracker.lookup("k-1") == found
    assert tracker.purge_expired() == 2
    assert tracker.lookup("k-1") is None


def test_every_write_request_is_logged_with_its_key(tracker: Tracker) -> None:
    """Requests list every write with its key and outcome, including refused and replayed ones."""
    file_done_after_delete(tracker, key="k-1")
    file_done_after_delete(tracker, key="k-1")
    with pytest.raises(AlreadyFiled):
        file_done_after_delete(tracker, key="k-2")
    with pytest.raises(IssueNotFound):
        tracker.comment(number=99, body="nowhere", key="c-9")
    tracker.comment(number=1, body="keyless", key=None)
    logged = [(r.operation, r.key, r.outcome, r.target) for r in tracker.requests()]
    assert logged == [
        ("file_issue", "k-1", "created", 1),
        ("file_issue", "k-1", "replayed", 1),
        ("file_issue", "k-2", "already_filed", 1),
        ("comment", "c-9", "issue_not_found", 99),
        ("comment", None, "created", 1),
    ]


def test_bad_requests_are_refused_clearly(tracker: Tracker) -> None:
    """An empty cause or an empty key is an InvalidRequest, and nothing is filed."""
    with pytest.raises(InvalidRequest, match="cause"):
        tracker.file_issue(title="t", body="b", cause=" -- ", reports=[], key="k")
    with pytest.raises(InvalidRequest, match="key"):
        file_done_after_delete(tracker, key="")
    assert tracker.issues() == []
    assert normalize_cause("Done_After  Delete!") == "done-after-delete"


def test_search_matches_title_body_and_cause(tracker: Tracker) -> None:
    """Search finds issues by a case-insensitive substring of their title, body or cause."""
    file_done_after_delete(tracker, key="k-1", title="KeyError in mark_done")
    tracker.file_issue(
        title="IndexError on empty title",
        body="rename(1, '')",
        cause="empty-title",
        reports=["CR-1043"],
        key="k-2",
    )
    assert [hit.number for hit in tracker.search("keyerror")] == [1]
    assert [hit.number for hit in tracker.search("EMPTY")] == [2]
    assert [hit.number for hit in tracker.search("rename(")] == [2]
    assert [hit.number for hit in tracker.search("")] == [1, 2]
    assert tracker.search("zulu") == []


def test_results_encode_as_json(tracker: Tracker) -> None:
    """Every answer encodes to JSON as it is, for a tool's text result."""
    issue = file_done_after_delete(tracker, key="k-1")
    tracker.comment(number=issue.number, body="note", key="c-1")
    for value in (
        issue,
        tracker.issues(),
        tracker.comments(),
        tracker.effects(),
        tracker.requests(),
    ):
        decoded = msgspec.json.decode(msgspec.json.encode(value))
        assert decoded
    assert msgspec.json.decode(msgspec.json.encode(issue), type=FiledIssue) == issue


def test_database_survives_reopening(tmp_path: Path, clock: MovableClock) -> None:
    """Issues, comments, keys and the audit trail are there for a new Tracker on the same file."""
    path = tmp_path / "tracker.db"
    first = Tracker(path, clock=clock)
    issue = file_done_after_delete(first, key="k-1")
    first.comment(number=issue.number, body="note", key="c-1")
    reopened = Tracker(path, clock=clock)
    assert reopened.get(issue.number) == first.get(issue.number)
    assert file_done_after_delete(reopened, key="k-1").replayed
    assert len(reopened.comments()) == 1
    assert len(reopened.effects()) == 2
    assert len(reopened.requests()) == 3


def test_two_processes_file_concurrently(tmp_path: Path) -> None:
    """Two processes filing different issues at once all succeed, with distinct numbers."""
    path, go = tmp_path / "tracker.db", tmp_path / "go"
    script = textwrap.dedent(
        """
        import os, sys, time
        from durably.triage.tracker import Tracker
        path, name, go = sys.argv[1], sys.argv[2], sys.argv[3]
        tracker = Tracker(path)
        while not os.path.exists(go):  # start together, to contend for the write lock
            time.sleep(0.001)
        for n in range(15):
            issue = tracker.file_issue(
                title=f"{name} {n}", body="b", cause=f"{name}-{n}", reports=[], key=f"{name}-{n}"
            )
            print(issue.number)
        """
    )
    children = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(path), name, str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("alpha", "beta")
    ]
    go.touch()
    outputs = [child.communicate(timeout=stretched(60)) for child in children]
    for child, (_, stderr) in zip(children, outputs, strict=True):
        assert child.returncode == 0, stderr
    numbers = [int(line) for stdout, _ in outputs for line in stdout.split()]
    assert sorted(numbers) == list(range(1, 31))
    tracker = Tracker(path)
    assert len(tracker.issues()) == 30
    assert len(tracker.effects()) == 30


def test_a_tracker_read_again_sees_writes_made_through_another(tmp_path: Path) -> None:
    """The connection a tracker keeps for reads never serves a stale view."""
    reader = Tracker(tmp_path / "tracker.db", key_ttl=TTL)
    writer = Tracker(tmp_path / "tracker.db", key_ttl=TTL)
    assert reader.issues() == []
    file_done_after_delete(writer, key="k-1")
    assert [issue.cause for issue in reader.issues()] == ["done-after-delete"]
    writer.comment(number=1, body="seen", key="k-2")
    assert [comment.body for comment in reader.comments()] == ["seen"]
    assert reader.lookup("k-2") is not None


def test_a_forked_child_reads_through_its_own_connection(tmp_path: Path) -> None:
    """A tracker used before a fork works in the child and, after the child exits, in the parent."""
    tracker = Tracker(tmp_path / "tracker.db", key_ttl=TTL)
    file_done_after_delete(tracker, key="k-1")
    assert len(tracker.issues()) == 1
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        try:
            tracker.comment(number=1, body="from the child", key="k-2")
            ok = [c.body for c in tracker.comments()] == ["from the child"]
        except BaseException:  # noqa: BLE001 - a forked child: any end is its exit status
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert [c.body for c in tracker.comments()] == ["from the child"]
