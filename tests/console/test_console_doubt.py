"""The console's in-doubt card: rerun is the risky answer, confirmed first; the tool's words."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from _console_runs import DOUBT, SAID, in_doubt_run
from starlette.testclient import TestClient

from durably.console.server import create_app
from durably.state import ResolutionOutcome
from durably.storechoice import StoreChoice
from durably.stores.file import FileStore

TOKEN = "t0ken-for-tests"  # noqa: S105 (a test token, not a secret)
ROOT = f"/t/{TOKEN}/"
CSS = Path(__file__).parents[2] / "src" / "durably" / "console" / "static" / "console.css"


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """A run directory holding one run paused on an in-doubt refund."""
    in_doubt_run(tmp_path / "runs")
    return tmp_path / "runs"


@pytest.fixture
def client(runs: Path) -> Iterator[TestClient]:
    """A test client of a console over the in-doubt run."""
    app = create_app(StoreChoice(directory=runs), token=TOKEN)
    with TestClient(app, base_url="http://127.0.0.1", follow_redirects=False) as client:
        yield client


def card(page: str) -> str:
    """The in-doubt question's block of a page."""
    found = re.search(r'<div class="question" id="q-c1".*?</form></div>', page, re.S)
    assert found, page
    return found.group(0)


def test_a_rerun_posted_without_its_confirmation_is_refused_and_nothing_saved(
    client: TestClient, runs: Path
) -> None:
    """A plain post of ``rerun`` without the form's confirmation is refused with why; none saved."""
    before = FileStore(runs).read_sync(DOUBT)

    for form in (
        {"call": "c1", "answer": "rerun"},
        {"call": "c1", "answer": "rerun", "confirm": ""},
    ):
        response = client.post(f"{ROOT}runs/{DOUBT}/answer", data=form)
        assert response.status_code == 409
        assert "answer not saved: a rerun must be confirmed" in response.text

    after = FileStore(runs).read_sync(DOUBT)
    assert list(after.pending) == ["c1"]
    assert list(after.markers) == ["c1"]
    assert after.resolutions == {}
    assert after.saved_at == before.saved_at

    confirmed = client.post(
        f"{ROOT}runs/{DOUBT}/answer", data={"call": "c1", "answer": "rerun", "confirm": "rerun"}
    )
    assert confirmed.status_code == 303
    saved = FileStore(runs).read_sync(DOUBT)
    assert saved.resolutions["c1"].outcome is ResolutionOutcome.RERUN
    assert saved.resolutions["c1"].by == "console"


def test_the_rerun_form_asks_first_naming_the_tool_its_effect_and_arguments(
    client: TestClient,
) -> None:
    """The rerun form holds a required confirmation saying what a rerun may repeat, on each page."""
    for path in (f"runs/{DOUBT}", "questions"):
        block = card(client.get(ROOT + path).text)
        form = re.search(r'<form[^>]*class="rerun-form".*?</form>', block, re.S)
        assert form, block
        assert re.search(r'<input type="checkbox" name="confirm" value="rerun" required>', form[0])
        text = html.unescape(re.sub(r"<[^>]+>", "", form[0]))
        assert (
            'Run refund again? If it did happen, refund(order_id="A-17", amount=30) happens '
            "twice: its effect is write, and it writes without a key" in text
        ), text


def test_rerun_is_styled_as_the_risky_answer_never_green() -> None:
    """The rerun button has a warning style of its own, not the approve button's green."""
    rules = dict(re.findall(r"^([^{/]+?)\s*\{([^}]*)\}", CSS.read_text(), re.M))
    rerun = next(body for selector, body in rules.items() if "button.rerun" in selector)
    approve = next(body for selector, body in rules.items() if "button.yes" in selector)
    green = re.search(r"background: (#[0-9a-f]+)", approve)
    assert green
    assert green[1] not in rerun
    assert "#b45309" in rerun  # the colour the console gives a write


def test_the_in_doubt_card_shows_what_the_tool_said(client: TestClient, runs: Path) -> None:
    """The message the tool gave with ``ToolInDoubt`` is on the card, escaped, beside the why."""
    assert SAID in (FileStore(runs).read_sync(DOUBT).pending["c1"].why or "")
    for path in (f"runs/{DOUBT}", "questions"):
        block = card(client.get(ROOT + path).text)
        assert "why a person: it writes without a key and has no lookup</div>" in block
        assert f"the tool said: <code>ToolInDoubt: {html.escape(SAID)}</code>" in block
        assert "<b>(timeout)</b>" not in block
