"""Every link between the project's own pages leads to a file and a heading that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, no punctuation, '-' for spaces."""
    found: set[str] = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def local_links(page: Path) -> list[str]:
    """The page's links to files of this repository (not web addresses, not mail)."""
    text = FENCE.sub("", page.read_text())
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_local_link_names_a_file_and_heading_that_exist(page: Path) -> None:
    """A renamed heading or moved page breaks the README's walkthrough silently otherwise."""
    broken = []
    for target in local_links(page):
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    assert not broken, broken


def test_the_walkthrough_links_its_terms_to_where_they_are_explained() -> None:
    """Terms the README uses before explaining them link to their definitions at first use."""
    readme = (ROOT / "README.md").read_text()
    for term in ("attempt marker", "resolution ladder", "configuration", "fork server", "`keyed`"):
        first = readme.index(term)
        assert readme[first - 1] == "[", f"the README's first {term!r} is not a link"
