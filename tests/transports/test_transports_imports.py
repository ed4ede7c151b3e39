"""The transports and receivers import no third-party package until used."""

from __future__ import annotations

import json
import subprocess
import sys

from _helpers.patience import stretched


def test_importing_durably_transports_and_receivers_stays_light() -> None:
    """``import durably.transports, durably.receivers`` loads neither httpx, mcp nor starlette."""
    probe = (
        "import json, sys, durably, durably.transports, durably.receivers;"
        "print(json.dumps(sorted(m for m in ('httpx', 'mcp', 'starlette', 'uvicorn', 'pydantic')"
        " if m in sys.modules)))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        timeout=stretched(60),
    )
    assert json.loads(loaded.stdout) == []
