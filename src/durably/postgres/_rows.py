"""What a Postgres row holds of its run's state, and the state it makes.

A run's row holds a snapshot (the checksummed envelope, naming the save that wrote it)
and ``durably_changes`` the change records of the saves since, one row each; reading
opens the snapshot and applies the changes in order, checking that they continue it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..checkpoint.delta import apply, decode_record
from ..checkpoint.envelope import open_sealed
from ..errors import CheckpointCorrupt
from ..state import RunState, check_ranges

__all__ = ["Stored", "decoded"]


@dataclass(frozen=True, slots=True)
class Stored:
    """What a row holds of its run's state: a snapshot, and the changes saved since it."""

    state: bytes
    """The snapshot, in the checksummed envelope."""
    state_seq: int
    """The number of the save that wrote the snapshot."""
    seq: int
    """The number of the last save."""
    changes: tuple[bytes, ...]
    """The change records of saves ``state_seq + 1`` to ``seq``, in order."""

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Stored:
        """From the columns :data:`~durably.postgres._sql.STORED` selects."""
        state, state_seq, seq, changes = row
        return cls(bytes(state), int(state_seq), int(seq), tuple(bytes(c) for c in changes))


def decoded(run_id: str, stored: Stored, *, path: str) -> RunState:
    """The state ``stored`` holds: its snapshot, and its changes applied in order.

    Raises:
        CheckpointCorrupt: naming ``path``, when the snapshot or a change is damaged,
            belongs to another run, or the changes do not run from the snapshot to
            the row's last save.
    """
    opened = open_sealed(stored.state, path=path)
    state = opened.state
    if state.run_id != run_id:
        raise CheckpointCorrupt(path=path, reason=f"it holds run {state.run_id!r}, not {run_id!r}")
    if opened.journal != stored.state_seq:
        raise CheckpointCorrupt(
            path=path,
            reason=f"its state is the snapshot of save {opened.journal} and the row says "
            f"{stored.state_seq} (the state column was replaced or altered)",
        )
    seq = stored.state_seq
    for change in stored.changes:
        where = f"durably_changes[{run_id!r}, {seq + 1}]"
        record = decode_record(change, path=path, where=where)
        if (record.seq, record.run, record.gen) != (seq + 1, run_id, 0):
            raise CheckpointCorrupt(
                path=path,
                reason=f"{where} holds the change of save {record.seq} of run "
                f"{record.run!r} (the rows were altered or moved)",
            )
        apply(state, record, path=path)
        seq = record.seq
    if seq < stored.seq:
        raise CheckpointCorrupt(
            path=path,
            reason=f"saves up to {stored.seq} were made and its changes end at save "
            f"{seq}: rows of durably_changes were deleted",
        )
    if seq > stored.seq:
        raise CheckpointCorrupt(
            path=path,
            reason=f"its changes go on to save {seq}, past the row's last save "
            f"{stored.seq}: the two tables come from different times (restored apart?)",
        )
    if stored.changes:
        check_ranges(state, path=path)
    return state
