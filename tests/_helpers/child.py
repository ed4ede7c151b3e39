"""Child processes for the store tests: each does one thing to a run, some die by SIGKILL.

Usage: ``python child.py <command> <state-dir> <run-id> [label]``. The commands:

- ``crash``: create the run with state A, then save state B under a CrashPlan
  that SIGKILLs this process at the crash point ``label``.
- ``crash-create``: create the run with state A under a CrashPlan killing at ``label``.
- ``hold``: open the run, print ``ready``, and keep it open until stdin closes.
- ``try-open``: try to open the run; print JSON ``{"outcome", "seconds"}``.
- ``save``: create the run with state A, save state B, close (traced with strace).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

# Run as a script: import the shared helpers as the tests do (and as mypy names them).
sys.path[:0] = [str(Path(__file__).parent.parent)]

from _helpers.samples import state_a, state_b  # noqa: E402
from durably import Locked  # noqa: E402
from durably.faults import CrashPlan, installed  # noqa: E402
from durably.stores.file import FileStore  # noqa: E402


def main(command: str, directory: str, run_id: str, label: str = "") -> None:
    store = FileStore(directory)
    if command == "crash":
        handle = store.create_sync(state_a(run_id))
        with installed(CrashPlan(label=label)):
            handle.save_sync(state_b(run_id))
        sys.exit(f"crash point {label} was never reached")
    elif command == "crash-create":
        with installed(CrashPlan(label=label)):
            store.create_sync(state_a(run_id))
        sys.exit(f"crash point {label} was never reached")
    elif command == "hold":
        store.open_sync(run_id)
        print("ready", flush=True)
        sys.stdin.read()
    elif command == "try-open":
        start = time.monotonic()
        try:
            handle, _ = store.open_sync(run_id)
        except Locked:
            outcome = "locked"
        else:
            outcome = "opened"
            handle.close_sync()
        print(json.dumps({"outcome": outcome, "seconds": time.monotonic() - start}))
    elif command == "save":
        handle = store.create_sync(state_a(run_id))
        handle.save_sync(state_b(run_id))
        handle.close_sync()
    else:
        sys.exit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
