"""The engine's save points are one list: the enum, the docs and the spec name the same five."""

from __future__ import annotations

import re
from pathlib import Path

from durably.engine import CRASH_POINT_PREFIX, Save, SavePoint

DOCS = Path(__file__).parent.parent / "docs"


def _numbered_points(text: str, heading: str) -> list[str]:
    """The bold names of the numbered list under ``heading`` (``1. **start**: ...``)."""
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\d+\. \*\*([^*]+)\*\*", section, flags=re.MULTILINE)


def test_the_docs_list_the_save_points_of_the_enum_in_order() -> None:
    """docs/concepts.md's "Save points" lists exactly ``SavePoint``'s members, in order."""
    documented = _numbered_points((DOCS / "concepts.md").read_text(), "## Save points")

    assert documented == [point.heading for point in SavePoint]
    assert len(documented) == 5


def test_every_save_has_its_own_crash_point_label() -> None:
    """Each save point and each other save has a distinct ``loop.saved.`` crash point."""
    labels = [p.crash_point for p in SavePoint] + [s.crash_point for s in Save]

    assert len(set(labels)) == len(labels) == len(SavePoint) + len(Save)
    assert all(label.startswith(CRASH_POINT_PREFIX) for label in labels)
    assert SavePoint.REPLY.crash_point == "loop.saved.reply"  # the reference tables' names


def test_the_engine_saves_only_through_named_points() -> None:
    """No save in the engine or the loop is made with a free string label."""
    package = Path(__file__).parent.parent / "src" / "durably"
    source = "".join(
        path.read_text()
        for path in [*sorted((package / "engine").glob("*.py")), package / "loop.py"]
    )

    assert re.findall(r"\.save\(\s*[\"']", source) == []
    assert 'faults.point(f"loop.saved.' not in source
