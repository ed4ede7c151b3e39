"""durably beside ``dbos-openai-agents``, both killed at the same moments.

The sweep's front-desk agent (``_oai_peer``) runs under ``DBOSRunner`` with DBOS's
SQLite system database (its tools ``@DBOS.step`` as its README says, and left plain)
and under ``DurableRunner``; each run is SIGKILLed inside a tool right after the
service acted, before the tool's result was recorded, then carried on the way each
system says to. The service's effects, the model's asks and the questions put to a
person are counted. The table is kept in tests/testdata/peer-dbos-openai-agents.txt
and quoted in docs/openai-agents.md.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from _oai_peer import ANSWER, KILL_POINTS, counts

from _helpers.peer import check_reference, killed_then_resumed

PEER = Path(__file__).parent / "_oai_peer.py"
REFERENCE = Path(__file__).parent.parent / "testdata" / "peer-dbos-openai-agents.txt"
SYSTEMS = ("dbos", "dbos-plain", "durably")


@pytest.mark.slow
@pytest.mark.timeout(900)  # eighteen processes, two at a time; DBOS's take seconds each
def test_dbos_repeats_the_effect_it_was_killed_after_and_durably_does_not(tmp_path: Path) -> None:
    """Killed after the service acted and before the result was recorded, DBOS runs the
    tool again on recovery (its steps repeat that one effect, plain tools every effect
    before it too); durably asks the lookup or a person, and performs each exactly once.
    Neither pays twice for a model reply.
    """

    def one(world: tuple[str, str]) -> dict[str, int]:
        system, kill_at = world
        root = tmp_path / f"{system}-{kill_at}"
        killed_then_resumed(PEER, system, root, kill_at, answer=ANSWER, armed=root / "service")
        return counts(root)

    worlds = [(system, kill_at) for system in SYSTEMS for kill_at in KILL_POINTS]
    with ThreadPoolExecutor(max_workers=2) as pool:  # two cores; the worlds share nothing
        found = dict(zip(worlds, pool.map(one, worlds), strict=True))

    lines = [
        "system      killed after  refunds  e-mails  notes  duplicates  model asks  "
        "paid twice  questions"
    ]
    duplicates: dict[tuple[str, str], int] = {}
    for (system, kill_at), n in found.items():
        duplicates[system, kill_at] = sum(n[kind] - 1 for kind in KILL_POINTS)
        lines.append(
            f"{system:11} {kill_at:12} {n['refunds']:8} {n['emails']:8} {n['notes']:6} "
            f"{duplicates[system, kill_at]:11} {n['asks']:11} {n['paid twice']:11} "
            f"{n['questions']:10}"
        )
    text = "\n".join(lines) + "\n"
    for kill_at in KILL_POINTS:
        assert duplicates["dbos", kill_at] == 1, text
        assert duplicates["dbos-plain", kill_at] >= 1, text
        assert duplicates["durably", kill_at] == 0, text
    assert all(n["paid twice"] == 0 for n in found.values()), text
    # Only the note (no key, no lookup) reaches a person under durably.
    assert [found["durably", k]["questions"] for k in KILL_POINTS] == [0, 0, 1], text
    check_reference(text, REFERENCE)
