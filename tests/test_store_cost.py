"""What a save costs in bytes, counted (never timed): it follows the change, not the state."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest
from typing_extensions import override

from durably._sysio import FileSystem
from durably.checkpoint import delta, envelope
from durably.state import (
    AssistantMessage,
    AttemptMarker,
    Decision,
    Resolution,
    ResolutionOutcome,
    RunState,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
    encode_state,
)
from durably.stores.file import FileStore
from durably.stores.journal import JournalStore

SAVES = 400
WHEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


class CountingFS(FileSystem):
    """The real file system, counting the bytes passed to write()."""

    def __init__(self) -> None:
        self.written = 0

    @override
    def write(self, fd: int, data: bytes) -> None:
        self.written += len(data)
        super().write(fd, data)


class CountingEncoder:
    """A msgspec JSON encoder that counts the bytes it produces."""

    def __init__(self, counter: list[int]) -> None:
        self._real = msgspec.json.Encoder()
        self._counter = counter

    def encode(self, value: object) -> bytes:
        """Encode ``value``, counting its bytes."""
        data = self._real.encode(value)
        self._counter[0] += len(data)
        return data

    def encode_into(self, value: object, buffer: bytearray, offset: int = 0) -> None:
        """Encode ``value`` into ``buffer`` at ``offset``, counting the bytes added."""
        before = len(buffer)
        self._real.encode_into(value, buffer, offset)
        self._counter[0] += len(buffer) - min(before, offset)


def turns(state: RunState) -> list[Callable[[], None]]:
    """The changes of a long run, one per save, each touching what the loop touches.

    Every field that grows for the run's life grows here: the messages, the
    workspace, the approvals given, the resolutions; markers come and go.
    """
    steps: list[Callable[[], None]] = []
    for n in range(SAVES // 2):
        call = ToolCall(id=f"call_{n}", name="write_file", arguments=f'{{"path": "f{n}.py"}}')

        def reply(n: int = n, call: ToolCall = call) -> None:
            state.messages.append(
                AssistantMessage(text="step " * 40, calls=(call,), turn=n + 1, model="m")
            )
            state.usage = state.usage + Usage(input_tokens=900, output_tokens=40)
            state.turns = n + 1
            state.markers[call.id] = AttemptMarker(key=f"k{n}", tool="write_file", started_at=WHEN)
            state.approvals_given[call.id] = Decision(approved=True, decided_at=WHEN, by="p")

        def result(n: int = n, call: ToolCall = call) -> None:
            state.messages.append(ToolResult(call_id=call.id, name=call.name, content="ok " * 90))
            state.markers.pop(call.id)
            state.workspace[f"src/module_{n}.py"] = f"{n:064x}"
            state.resolutions[call.id] = Resolution(step=1, outcome=ResolutionOutcome.RERUN)

        steps += [reply, result]
    return steps


class Counts:
    """Per save of one growing run: bytes written, bytes encoded, and sizes of the state."""

    def __init__(self) -> None:
        self.written: list[int] = []
        self.encoded: list[int] = []
        self.state: list[int] = []
        """The whole state, encoded."""
        self.change: list[int] = []
        """The fields other than the messages, and the newest message, encoded."""


def counted_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store_type: Callable[..., FileStore]
) -> Counts:
    """Count one growing run's saves, then check it reads back as the last state saved."""
    encoded = [0]
    monkeypatch.setattr(delta, "_field_encoder", CountingEncoder(encoded))
    monkeypatch.setattr(delta, "_record_encoder", CountingEncoder(encoded))
    real_init = envelope.Sealer.__init__

    def counting_sealer(self: envelope.Sealer) -> None:
        real_init(self)
        self._encoder = CountingEncoder(encoded)  # type: ignore[assignment]

    monkeypatch.setattr(envelope.Sealer, "__init__", counting_sealer)
    fs = CountingFS()
    store = store_type(tmp_path / "runs", sync=False, fs=fs)
    state = RunState(
        run_id="r1", task="t", created_at=WHEN, messages=[UserMessage(text="a long task")]
    )
    handle = store.create_sync(state)
    counts = Counts()
    for step in turns(state):
        step()
        fs.written, encoded[0] = 0, 0
        handle.save_sync(state)
        counts.written.append(fs.written)
        counts.encoded.append(encoded[0])
        counts.state.append(len(encode_state(state)))
        others = msgspec.structs.replace(state, messages=[])
        counts.change.append(
            len(encode_state(others)) + len(msgspec.json.encode(state.messages[-1]))
        )
    handle.close_sync()
    assert store.read_sync("r1") == state
    return counts


def test_a_journal_save_writes_and_encodes_the_change_not_the_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over a run whose state grows 40-fold, a journal save's bytes stay those of one change."""

    def store(directory: Path, **options: object) -> JournalStore:
        return JournalStore(directory, compact_min_bytes=1 << 40, **options)  # type: ignore[arg-type]

    counts = counted_run(tmp_path, monkeypatch, store)
    assert counts.state[-1] > 40 * counts.state[0]  # it grew, in its dicts as in its messages
    first, last = slice(2, 52), slice(-50, None)
    assert max(counts.written[last]) <= 1.1 * max(counts.written[first])
    assert max(counts.encoded[last]) <= 1.1 * max(counts.encoded[first])
    assert max(counts.written) < 1000  # one message, a few keys and the counters


def test_a_snapshot_save_writes_the_state_and_encodes_only_the_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot save writes the whole state but encodes the new message and other fields only."""
    counts = counted_run(tmp_path, monkeypatch, FileStore)
    for written, encoded, state, change in zip(
        counts.written, counts.encoded, counts.state, counts.change, strict=True
    ):
        assert 0 < written - state <= len(b'{"durably":1,"crc32":4294967295,"state":}')
        assert encoded <= change + 2  # a list's brackets around the new message
    assert counts.change[-1] < counts.state[-1] / 4  # most of the state was not encoded again
