"""Write the runs of this directory with the store code checked out (see README.md)."""

from __future__ import annotations

import os
import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path

import msgspec

sys.path.insert(0, "tests")
from _helpers.samples import state_b
from durably.state import (
    AssistantMessage,
    Decision,
    Phase,
    Resolution,
    ResolutionOutcome,
    RunState,
    ToolCall,
    ToolResult,
)
from durably.stores.file import FileStore
from durably.stores.journal import JournalStore

OUT = Path("tests/testdata/main-format")
WORK = Path("/tmp/durably-fixture-work")
DECIDED = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def run(store: FileStore, run_id: str) -> RunState:
    """Four turns, each changing messages and the dict fields (added and removed keys)."""
    state = state_b(run_id)
    handle = store.create_sync(state)
    for n in range(2, 6):
        call = ToolCall(id=f"c{n}", name="write_file", arguments=f'{{"path": "f{n}.py"}}')
        state.messages.append(AssistantMessage(text=f"turn {n}", calls=(call,), turn=n, model="m"))
        state.turns, state.phase = n, Phase.TOOLS
        handle.save_sync(state)
        given = Decision(approved=True, reason="ok", decided_at=DECIDED, by="tester")
        state.approvals_given[call.id] = given
        state.resolutions[call.id] = Resolution(step=1, outcome=ResolutionOutcome.RERUN)
        state.workspace[f"f{n}.py"] = f"{n:064x}"
        state.workspace.pop(f"f{n - 2}.py", None)
        state.messages.append(ToolResult(call_id=call.id, name="write_file", content="w " * n))
        state.phase = Phase.MODEL
        handle.save_sync(state)
    handle.close_sync()
    store.close_sync()
    return state


def main() -> None:
    """Write both stores' fixture runs afresh (see README.md beside this file)."""
    shutil.rmtree(OUT / "snapshot", ignore_errors=True)
    shutil.rmtree(OUT / "journal", ignore_errors=True)
    shutil.rmtree(WORK, ignore_errors=True)
    finals = {
        "snapshot": run(FileStore(WORK / "snapshot"), "snap-1"),
        "journal": run(JournalStore(WORK / "journal"), "jour-1"),
    }
    for kind, state in finals.items():
        (OUT / kind).mkdir(parents=True)
        for name in sorted(os.listdir(WORK / kind)):
            shutil.copyfile(WORK / kind / name, OUT / kind / name)
        expected = msgspec.json.format(msgspec.json.encode(state))
        (OUT / f"{state.run_id}.expected.json").write_bytes(expected)


if __name__ == "__main__":
    main()
