"""Run IDs and idempotency keys: keys are derived, stable everywhere, and never collide."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

import durably
from _helpers.patience import stretched
from durably.keys import RUN_ID_PATTERN, idempotency_key, new_run_id, validate_run_id


def by_hand(*parts: bytes) -> str:
    """The key as SPEC section 5 describes it: length-prefixed parts, SHA-256, 16 bytes in hex."""
    framed = b"".join(str(len(part)).encode() + b":" + part for part in parts)
    return hashlib.sha256(framed).hexdigest()[:32]


@pytest.mark.parametrize(
    ("run_id", "call_id", "framed"),
    [
        ("r", "c", b"1:r1:c"),
        ("run-1", "call_abc", b"5:run-18:call_abc"),
        ("", "", b"0:0:"),
        ("x" * 12, "toolu_01", b"12:xxxxxxxxxxxx8:toolu_01"),
    ],
)
def test_the_key_is_sha256_over_length_prefixed_ids(
    run_id: str, call_id: str, framed: bytes
) -> None:
    """The key is the first 16 bytes in hex of SHA-256 over `<len>:<run><len>:<call>`."""
    assert idempotency_key(run_id, call_id) == hashlib.sha256(framed).hexdigest()[:32]


def test_the_key_of_r_and_c_is_a_fixed_vector() -> None:
    """key("r", "c") is a constant, so a change to the derivation cannot go unnoticed."""
    assert idempotency_key("r", "c") == by_hand(b"r", b"c")
    assert idempotency_key("r", "c") == hashlib.sha256(b"1:r1:c").hexdigest()[:32]


def test_length_prefixes_keep_shifted_boundaries_apart() -> None:
    """("ab", "c") and ("a", "bc") get different keys although their concatenations agree."""
    assert idempotency_key("ab", "c") != idempotency_key("a", "bc")
    assert idempotency_key("ab", "c") == by_hand(b"ab", b"c")
    assert idempotency_key("a", "bc") == by_hand(b"a", b"bc")


def test_lengths_count_utf8_bytes_not_characters() -> None:
    """A non-ASCII ID is prefixed with the length of its UTF-8 bytes."""
    assert (
        idempotency_key("é", "调用")
        == hashlib.sha256(b"2:\xc3\xa96:\xe8\xb0\x83\xe7\x94\xa8").hexdigest()[:32]
    )
    assert idempotency_key("é", "调用") == by_hand("é".encode(), "调用".encode())


@given(run_id=st.text(), call_id=st.text())
def test_the_key_is_32_lowercase_hex_digits(run_id: str, call_id: str) -> None:
    """Every key is 32 lowercase hex digits, matching the hand-made derivation."""
    key = idempotency_key(run_id, call_id)
    assert re.fullmatch(r"[0-9a-f]{32}", key)
    assert key == by_hand(run_id.encode(), call_id.encode())


@given(
    first=st.tuples(st.text(max_size=8), st.text(max_size=8)),
    second=st.tuples(st.text(max_size=8), st.text(max_size=8)),
)
def test_distinct_calls_get_distinct_keys(first: tuple[str, str], second: tuple[str, str]) -> None:
    """Two different (run ID, call ID) pairs never share a key."""
    if first != second:
        assert idempotency_key(*first) != idempotency_key(*second)
    else:
        assert idempotency_key(*first) == idempotency_key(*second)


def test_another_process_derives_the_same_key() -> None:
    """A fresh process (as after a crash) computes the same key for the same call."""
    pairs = [
        ("r", "c"),
        ("ab", "c"),
        ("é", "调用"),
        ("triage-20250101T000000Z-abcd1234", "toolu_1"),
    ]
    code = (
        "import sys, json; from durably import idempotency_key; "
        "print(json.dumps([idempotency_key(r, c) for r, c in json.loads(sys.argv[1])]))"
    )
    child = subprocess.run(
        [sys.executable, "-c", code, json.dumps(pairs)],
        capture_output=True,
        text=True,
        check=True,
        timeout=stretched(60),
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    assert json.loads(child.stdout) == [idempotency_key(r, c) for r, c in pairs]


def test_idempotency_key_is_public() -> None:
    """durably.idempotency_key is the derivation tools and services share."""
    assert durably.idempotency_key is idempotency_key


def test_a_new_run_id_names_task_time_and_eight_random_characters() -> None:
    """new_run_id gives `<task>-<YYYYmmddTHHMMSSZ>-<8 [a-z0-9]>`, a valid run ID."""
    before = datetime.now(UTC).replace(microsecond=0)
    run_id = new_run_id("m1-done-after-delete")
    after = datetime.now(UTC)
    match = re.fullmatch(r"m1-done-after-delete-(\d{8}T\d{6}Z)-([a-z0-9]{8})", run_id)
    assert match is not None, run_id
    when = datetime.strptime(match.group(1), "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    assert before <= when <= after
    assert validate_run_id(run_id) == run_id


def test_the_run_id_time_is_utc() -> None:
    """A clock in another time zone still gives the UTC time in the run ID."""
    tokyo = datetime(2025, 1, 2, 9, 0, 0, tzinfo=timezone(timedelta(hours=9)))
    assert new_run_id("t", now=tokyo).startswith("t-20250102T000000Z-")


def test_new_run_ids_do_not_repeat() -> None:
    """A thousand run IDs for one task in the same second are all different."""
    now = datetime(2025, 1, 2, tzinfo=UTC)
    assert len({new_run_id("t", now=now) for _ in range(1000)}) == 1000


@pytest.mark.parametrize(
    ("task", "prefix"),
    [
        ("fix bug #12 / flaky", "fix-bug-12-flaky-"),
        ("../../etc", "etc-"),
        ("", "run-"),
        ("日本語", "run-"),
        ("." * 5, "run-"),
        ("x" * 300, "x" * 80 + "-"),
    ],
)
def test_any_task_gives_a_valid_run_id(task: str, prefix: str) -> None:
    """The task part is cut down to allowed characters, so any task makes a valid run ID."""
    run_id = new_run_id(task)
    assert run_id.startswith(prefix)
    assert validate_run_id(run_id) == run_id


@given(task=st.text())
def test_every_task_gives_a_valid_run_id(task: str) -> None:
    """new_run_id never produces an ID that validate_run_id refuses."""
    run_id = new_run_id(task)
    assert RUN_ID_PATTERN.fullmatch(run_id)


@pytest.mark.parametrize(
    "bad",
    ["", ".", "..", "a/b", "a\x00b", "a" * 129, ".hidden", "-x", "_x", "é", "ａ", "a\n", "a b"],
)
def test_a_bad_run_id_is_invalid(bad: str) -> None:
    """validate_run_id refuses anything outside `[A-Za-z0-9][A-Za-z0-9._-]{0,127}`."""
    with pytest.raises(durably.InvalidRunId) as caught:
        validate_run_id(bad)
    assert caught.value.run_id == bad


@pytest.mark.parametrize("good", ["a", "A.b_c-9", "a" * 128, "0", "run..x"])
def test_a_good_run_id_is_returned_unchanged(good: str) -> None:
    """validate_run_id hands back an allowed ID as it is."""
    assert validate_run_id(good) == good
