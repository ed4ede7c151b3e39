"""durably beside Pydantic AI's DBOS integration, both killed at the same moments.

The same agent (``_pai_peer``) runs under ``DBOSDurability`` with DBOS's SQLite
system database and under ``Durable``; each run is SIGKILLed inside a tool right
after the service acted, before the tool's result was recorded, then carried on
the way each system says to. The service's effects are counted. The table is kept
in tests/testdata/peer-dbos-pydantic-ai.txt and quoted in docs/pydantic-ai.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _pai_peer import ANSWER, KILL_POINTS, effects

from _helpers.peer import check_reference, killed_then_resumed

PEER = Path(__file__).parent / "_pai_peer.py"
REFERENCE = Path(__file__).parent.parent / "testdata" / "peer-dbos-pydantic-ai.txt"
SYSTEMS = ("dbos", "durably")


@pytest.mark.slow
@pytest.mark.timeout(900)  # eight processes; DBOS's take a few seconds each
def test_dbos_repeats_the_effect_it_was_killed_after_and_durably_does_not(tmp_path: Path) -> None:
    """Killed after the service acted and before the result was saved, DBOS runs the
    tool again on recovery (a second refund, a second e-mail); durably asks the
    tool's lookup, finds the effect, and performs each exactly once.
    """
    lines = ["system   killed after  refunds  e-mails  duplicates"]
    duplicates: dict[tuple[str, str], int] = {}
    for system in SYSTEMS:
        for kill_at in KILL_POINTS:
            root = tmp_path / f"{system}-{kill_at}"
            killed_then_resumed(PEER, system, root, kill_at, answer=ANSWER)
            counted = effects(root)
            extra = sum(n - 1 for n in counted.values())
            duplicates[system, kill_at] = extra
            lines.append(
                f"{system:8} {kill_at:13} {counted['refund']:7}  "
                f"{counted['send_email']:7}  {extra:10}"
            )
    text = "\n".join(lines) + "\n"
    for kill_at in KILL_POINTS:
        assert duplicates["dbos", kill_at] >= 1, text
        assert duplicates["durably", kill_at] == 0, text
    check_reference(text, REFERENCE)  # printed (with -s): the table the docs quote
