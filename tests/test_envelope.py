"""The snapshot envelope: what the incremental sealer writes, and how it is read back."""

from __future__ import annotations

import zlib

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import durably
from _helpers.samples import state_a, state_b
from durably.checkpoint import envelope
from durably.checkpoint.envelope import Sealer, open_sealed, seal
from durably.state import AssistantMessage, RunState, ToolResult, UserMessage, encode_state


def grown(state: RunState, n: int) -> None:
    """Append turn ``n`` (a reply and a result with non-ASCII text) to ``state``."""
    state.messages.append(AssistantMessage(text=f"turn {n} ü", turn=n))
    state.messages.append(ToolResult(call_id=f"c{n}", name="t", content="x" * n))
    state.turns = n


# One step of a run's life between two saves, as the loop and the context policy make them.
_steps = st.sampled_from(
    ["append", "append", "append", "nothing", "new list", "cut in place", "field", "generation"]
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_steps, max_size=25))
def test_a_kept_seal_is_byte_for_byte_a_fresh_one(steps: list[str]) -> None:
    """Whatever a run does between saves, the sealer's output equals sealing from nothing."""
    sealer = Sealer()
    state = state_b("r1")
    journal = 0
    for n, step in enumerate(steps, start=2):
        if step == "append":
            grown(state, n)
        elif step == "new list":  # the context policy: a new, shorter list
            state.messages = state.messages[2:]
            state.summarized += 2
        elif step == "cut in place":  # not what the loop does; must not fool the sealer
            del state.messages[:1]
            state.messages.append(UserMessage(text=f"again {n}"))
        elif step == "field":
            state.workspace[f"f{n}"] = "ab" * 32
        elif step == "generation":
            journal += 1
        data = sealer.seal(state, journal=journal)
        assert data == Sealer().seal(state, journal=journal)  # a new buffer
        assert data == seal(state, journal=journal)  # the thread's reused buffer
        opened = open_sealed(data, path="x")
        assert opened.state == state
        assert opened.journal == journal


def test_the_messages_come_first_and_the_checksum_covers_the_state() -> None:
    """The state is written messages first, its CRC-32 in the envelope, readable as JSON."""
    state = state_b("r1")
    document = msgspec.json.decode(seal(state))
    assert list(document) == ["durably", "crc32", "state"]
    assert next(iter(document["state"])) == "messages"
    body = seal(state).split(b'"state":', 1)[1][:-1]
    assert document["crc32"] == zlib.crc32(body)
    assert msgspec.json.decode(body) == msgspec.json.decode(encode_state(state))


def test_an_envelope_in_main_s_layout_still_opens() -> None:
    """An envelope written by msgspec in the field order of main's code loads the same."""
    state = state_b("r1")
    body = encode_state(state)
    for version, journal, seed in [(1, 0, 0), (2, 4, zlib.crc32(b"journal 4\n"))]:
        parts = b'{"durably":%d,"crc32":%d,' % (version, zlib.crc32(body, seed))
        if journal:
            parts += b'"journal":%d,' % journal
        data = parts + b'"state":' + body + b"}"
        opened = open_sealed(data, path="x")
        assert (opened.state, opened.journal, opened.version) == (state, journal, version)
        spaced = data.replace(b'"state":', b'"state" : ')  # not as written: the general path
        assert open_sealed(spaced, path="x").state == state


@pytest.mark.parametrize(
    "mangle",
    [
        lambda d: d.replace(b"triage", b"TRIAGE"),
        lambda d: d[:-1],
        lambda d: d + b" ",
        lambda d: d.replace(b'"durably":1', b'"durably":9'),
        lambda d: d.replace(b'"crc32":', b'"crc32":0'),
        lambda d: d[:40] + b"\x00" + d[41:],
    ],
    ids=["altered", "cut", "trailing space", "unknown version", "leading zero", "garbage"],
)
def test_a_damaged_envelope_is_corrupt(mangle: object) -> None:
    """An altered, cut or garbled envelope is CheckpointCorrupt by either path, never a state."""
    data = seal(state_a("r1"))
    assert callable(mangle)
    damaged = mangle(data)
    if damaged.endswith(b" "):  # whitespace is legal JSON: the general path reads it
        assert open_sealed(damaged, path="x").state == state_a("r1")
        return
    with pytest.raises(durably.CheckpointCorrupt):
        open_sealed(damaged, path="x")


def test_a_version_and_a_generation_must_agree() -> None:
    """Version 1 names no log and versions 2 and 3 name one: anything else is refused."""
    state = state_a("r1")
    with pytest.raises(ValueError, match="version"):
        Sealer().seal(state, journal=0, version=3)
    with pytest.raises(ValueError, match="version"):
        Sealer().seal(state, journal=2, version=1)
    assert open_sealed(seal(state, journal=2, version=2), path="x").version == 2
    assert envelope.VERSIONS == (1, 2, 3)
