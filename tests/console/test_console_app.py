"""The console's pages and its one write route: escaped text, a token for writes, stale answers."""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from _console_runs import HOSTILE, LONG, RUN, agent_for, long_run, paused_run
from starlette.testclient import TestClient

import durably
from durably.console.pages import SHOWN, Page, run_page
from durably.console.server import create_app
from durably.decisions import answer
from durably.errors import StoreUnavailable
from durably.state import Phase, Resolution, ResolutionOutcome
from durably.storechoice import StoreChoice
from durably.stores import _index
from durably.stores.directory import DirectoryStore
from durably.stores.file import FileStore

TOKEN = "t0ken-for-tests"  # noqa: S105 (a test token, not a secret)
ROOT = f"/t/{TOKEN}/"


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """A run directory holding one paused run."""
    paused_run(tmp_path / "runs")
    return tmp_path / "runs"


def client_for(runs: Path, **options: object) -> Iterator[TestClient]:
    """A test client of a console app over ``runs``, built with ``options``."""
    app = create_app(StoreChoice(directory=runs), token=TOKEN, **options)  # type: ignore[arg-type]
    with TestClient(app, base_url="http://127.0.0.1", follow_redirects=False) as client:
        yield client


@pytest.fixture
def client(runs: Path) -> Iterator[TestClient]:
    """A test client of a console over the paused run."""
    yield from client_for(runs)


def test_model_and_tool_text_renders_as_text_never_as_markup(client: TestClient) -> None:
    """Markup in the task, the reply and the arguments arrives escaped on every page."""
    for path in ("", "questions", f"runs/{RUN}"):
        page = client.get(ROOT + path).text
        assert "<script>document" not in page
        assert "<img src=x" not in page
        assert page.count("<script") == 1  # the console's own script, nothing else
        assert f'<script src="{ROOT}static/console.js"></script>' in page
    run_page = client.get(f"{ROOT}runs/{RUN}").text
    assert "&lt;script&gt;document.title=&quot;owned&quot;&lt;/script&gt;" in run_page
    assert "&lt;/pre&gt;" in run_page


def test_pages_forbid_every_script_but_the_consoles_own(client: TestClient) -> None:
    """The Content-Security-Policy allows same-origin scripts only: a missed escape stays inert."""
    policy = client.get(ROOT).headers["content-security-policy"]
    assert "script-src 'self'" in policy
    assert "unsafe-inline" not in policy


def test_an_answer_without_the_token_is_refused_403_and_nothing_saved(
    client: TestClient, runs: Path
) -> None:
    """A POST to an address without the token, or with a wrong one, gets 403; nothing saved."""
    form = {"call": "c1", "answer": "yes", "token": TOKEN}
    for path in (
        f"/runs/{RUN}/answer",
        f"/t/x/runs/{RUN}/answer",
        f"/t/{TOKEN}x/runs/{RUN}/answer",
    ):
        response = client.post(path, data=form)
        assert response.status_code == 403
    assert list(FileStore(runs).read_sync(RUN).pending) == ["c1"]


def test_no_address_without_the_token_shows_anything_of_a_run(client: TestClient) -> None:
    """Pages, polls, whole texts and static files need the token; without it, how to open it."""
    paths = [
        "/",
        "/questions",
        f"/runs/{RUN}",
        f"/runs/{RUN}?stamp=1",
        f"/runs/{RUN}/text?part=task",
        "/static/console.js",
        "/t/",
        "/t/wrong/",
        f"/t/wrong/runs/{RUN}",
        f"/t/{TOKEN[:-1]}/runs/{RUN}",
        f"/x/t/{TOKEN}/runs/{RUN}",
    ]
    for path in paths:
        response = client.get(path)
        assert response.status_code == 403, path
        assert RUN not in response.text, path
        assert "refund" not in response.text, path
        assert "Open the address <code>durably console</code> printed" in response.text
        assert TOKEN not in response.text
    assert client.get(f"{ROOT}runs/{RUN}").status_code == 200
    assert client.get(f"/t/{TOKEN}").headers["location"] == ROOT


def test_the_console_sets_no_cookie(client: TestClient) -> None:
    """No response sets a cookie: a cookie would reach every other port of the host."""
    for path in ("", "questions", f"runs/{RUN}", f"runs/{RUN}?stamp=1", "static/console.js"):
        assert "set-cookie" not in client.get(ROOT + path).headers
    response = client.post(f"{ROOT}runs/{RUN}/answer", data={"call": "c1", "answer": "yes"})
    assert response.status_code == 303
    assert "set-cookie" not in response.headers
    assert not client.cookies


def test_an_answer_with_the_token_is_the_same_saved_decision(
    client: TestClient, runs: Path
) -> None:
    """The console's approve button saves the decision ``durably answer`` saves, then redirects."""
    page = client.get(f"{ROOT}questions").text
    assert f'<form method="post" action="{ROOT}runs/{RUN}/answer">' in page

    response = client.post(
        f"{ROOT}runs/{RUN}/answer",
        data={"call": "c1", "answer": "no", "reason": "<b>not</b> now"},
    )

    assert response.status_code == 303
    assert response.headers["location"] == f"{ROOT}runs/{RUN}?saved=c1"
    state = FileStore(runs).read_sync(RUN)
    assert state.pending == {}
    assert state.decisions["c1"].approved is False
    assert state.decisions["c1"].reason == "<b>not</b> now"
    assert state.phase is Phase.TOOLS
    shown = client.get(response.headers["location"]).text
    assert "answer to c1 saved: refused by console" in shown
    assert "&lt;b&gt;not&lt;/b&gt; now" in shown


def test_who_answered_stays_on_the_timeline_after_the_run_finished(
    client: TestClient, runs: Path
) -> None:
    """A console refusal shows as "refused by console ...: reason" once the run is done."""
    response = client.post(
        f"{ROOT}runs/{RUN}/answer",
        data={"call": "c1", "answer": "no", "reason": "<b>not</b> now"},
    )
    assert response.status_code == 303

    outcome = asyncio.run(agent_for(runs).resume(RUN))

    assert outcome.status == "done"
    state = FileStore(runs).read_sync(RUN)
    assert state.decisions == {}  # the reply moved on: only the run-long record keeps it
    assert state.approvals_given["c1"].by == "console"
    page = client.get(f"{ROOT}runs/{RUN}").text
    assert re.search(
        r"approval: refused by console at [0-9T:+-]+: &lt;b&gt;not&lt;/b&gt; now", page
    ), page


def test_an_approver_name_with_markup_renders_as_text(tmp_path: Path) -> None:
    """Who answered is escaped like everything else on the run page."""
    runs = tmp_path / "runs"
    paused_run(runs)
    asyncio.run(
        answer(FileStore(runs), run_id=RUN, call_id="c1", decision=durably.Yes(), by=HOSTILE)
    )
    for client in client_for(runs):
        page = client.get(f"{ROOT}runs/{RUN}").text
        assert "approval: approved by &lt;script&gt;" in page
        assert page.count("<script") == 1


def test_a_stale_answer_is_refused_with_a_visible_reason(client: TestClient, runs: Path) -> None:
    """An answer to a question answered meanwhile (here by the CLI's function) shows why, 409."""
    asyncio.run(answer(FileStore(runs), run_id=RUN, call_id="c1", decision=durably.Yes()))

    response = client.post(f"{ROOT}runs/{RUN}/answer", data={"call": "c1", "answer": "no"})

    assert response.status_code == 409
    assert re.search(
        r'role="alert">answer not saved: it was already answered \(approved\)', response.text
    )
    assert FileStore(runs).read_sync(RUN).decisions["c1"].approved


def test_a_read_only_console_serves_no_write_route(runs: Path) -> None:
    """With read_only there is no answer route at all, even with the token, and no forms."""
    for client in client_for(runs, read_only=True):
        response = client.post(f"{ROOT}runs/{RUN}/answer", data={"call": "c1", "answer": "yes"})
        assert response.status_code in (404, 405)
        assert "<form" not in client.get(f"{ROOT}questions").text
    assert list(FileStore(runs).read_sync(RUN).pending) == ["c1"]


def test_only_the_hosts_the_console_serves_are_answered(client: TestClient) -> None:
    """A request naming another host (a DNS-rebinding page) is refused."""
    assert client.get(ROOT, headers={"host": "evil.example"}).status_code == 400
    assert client.get(ROOT, headers={"host": "localhost:8470"}).status_code == 200


def test_the_runs_table_filters_by_phase(client: TestClient) -> None:
    """The phase filter keeps runs in that phase only."""
    assert RUN in client.get(ROOT, params={"phase": "paused"}).text
    assert RUN not in client.get(ROOT, params={"phase": "done"}).text


def test_recorded_workspace_files_are_checked_against_the_disk(tmp_path: Path) -> None:
    """Each file the run recorded shows whether it still matches, was changed or is missing."""
    runs = tmp_path / "runs"
    paused_run(runs)
    store = FileStore(runs)
    handle, state = store.open_sync(RUN)
    same, edited = b"kept\n", b"before\n"
    state.workspace = {
        "same.txt": hashlib.sha256(same).hexdigest(),
        "edited.txt": hashlib.sha256(edited).hexdigest(),
        "gone.txt": hashlib.sha256(b"x").hexdigest(),
    }
    handle.save_sync(state)
    handle.close_sync()
    root = tmp_path / "worlds" / RUN
    root.mkdir(parents=True)
    (root / "same.txt").write_bytes(same)
    (root / "edited.txt").write_bytes(b"after\n")

    for client in client_for(runs, workspace=str(tmp_path / "worlds" / "{run}")):
        page = client.get(f"{ROOT}runs/{RUN}").text
    rows = dict(re.findall(r"<code>([a-z]+\.txt)</code>.*?class=\"[a-z-]+\">([a-z ]+)</td>", page))
    assert rows == {"edited.txt": "changed", "gone.txt": "missing", "same.txt": "matches"}


def test_an_unknown_or_malformed_run_is_not_found(client: TestClient) -> None:
    """A run ID that is not in the store, or could never be one, is a 404 naming it."""
    assert client.get(f"{ROOT}runs/nope").status_code == 404
    missing = client.get(f"{ROOT}runs/..%2F..%2Fetc")
    assert missing.status_code == 404


def test_a_store_that_fails_is_a_page_saying_so(
    runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that cannot be reached answers 503 with the store's own message, no traceback."""

    def unreachable(store: DirectoryStore) -> list[str]:
        raise StoreUnavailable(where=str(store.directory), reason="the disk went away")

    # The runs page lists through the listing index, which starts by scanning the directory.
    monkeypatch.setattr(_index, "scan", unreachable)
    for client in client_for(runs):
        response = client.get(ROOT)
    assert response.status_code == 503
    assert "the store failed" in response.text
    assert "the disk went away" in response.text


def test_a_step_3_resolution_shows_who_answered(tmp_path: Path) -> None:
    """A call a person settled shows "answered by X" on the run's timeline, escaped."""
    runs = tmp_path / "runs"
    paused_run(runs)
    store = FileStore(runs)
    state = store.read_sync(RUN)
    state.resolutions["c1"] = Resolution(
        step=3, outcome=ResolutionOutcome.DONE, detail="decided", by="<i>carol</i>"
    )
    page = run_page(Page(store="runs", root=ROOT, read_only=True), state, None)
    assert "→ done · decided · answered by &lt;i&gt;carol&lt;/i&gt;" in page


def test_a_forged_saved_notice_shows_nothing(client: TestClient) -> None:
    """``?saved=`` shows "answer saved" only for an answer the run holds, worded from it."""
    for forged in ("c1", "<b>anything</b>", "zz"):
        page = client.get(f"{ROOT}runs/{RUN}", params={"saved": forged}).text
        assert 'role="status"' not in page, forged
        assert "saved" not in page.split("<main", 1)[1].split("<h1>", 1)[0], forged
    answered = client.post(f"{ROOT}runs/{RUN}/answer", data={"call": "c1", "answer": "yes"})
    page = client.get(answered.headers["location"]).text
    assert (
        '<div class="notice ok" role="status">answer to c1 saved: approved by console</div>' in page
    )
    assert 'role="status"' not in client.get(f"{ROOT}runs/{RUN}", params={"saved": "zz"}).text


def test_long_texts_are_cut_with_a_link_to_the_whole(tmp_path: Path) -> None:
    """A run's long reply, result, arguments, task and answer show SHOWN characters and a link."""
    size = 2_000_000
    long_run(tmp_path / "runs", size)
    for client in client_for(tmp_path / "runs"):
        page = client.get(f"{ROOT}runs/{LONG}").text
        assert len(page) < 8 * SHOWN  # seven texts of SHOWN characters, and the rest of the page
        links = re.findall(r'href="([^"]*/text\?part=[^"]*)"', page)
        # The task, the answer, the user's message, two replies, the arguments, the result.
        assert len(links) == 7, links
        wholes = {link.rsplit("=", 1)[1]: client.get(link.replace("&amp;", "&")) for link in links}
        texts = {part: response.text for part, response in wholes.items()}
        assert all(r.headers["content-type"].startswith("text/plain") for r in wholes.values())
        assert texts["task"] == "k" * size
        assert texts["answer"] == "a" * size
        assert texts["arguments-c1"] == '{"query": "' + "q" * size + '"}'
        assert sorted(v[len(v) // 2] for v in texts.values()) == ["a", "a", "k", "k", "q", "r", "t"]
        assert all(len(v) >= size for v in texts.values())
        assert (
            client.get(f"{ROOT}runs/{LONG}/text", params={"part": "message-99"}).status_code == 404
        )
        assert client.get(f"/runs/{LONG}/text", params={"part": "task"}).status_code == 403


def test_the_poll_asks_a_small_stamp_that_changes_when_the_run_is_saved(
    client: TestClient, runs: Path
) -> None:
    """``?stamp=1`` answers the page's version in a few bytes; a save changes it."""
    for path in ("", "questions", f"runs/{RUN}"):
        page = client.get(ROOT + path).text
        stamp = client.get(ROOT + path, params={"stamp": "1"})
        assert stamp.headers["content-type"].startswith("text/plain")
        assert len(stamp.content) < 40
        assert f'data-version="{stamp.text}"' in page, path
    before = {
        p: client.get(ROOT + p, params={"stamp": "1"}).text
        for p in ("", "questions", f"runs/{RUN}")
    }
    asyncio.run(answer(FileStore(runs), run_id=RUN, call_id="c1", decision=durably.Yes()))
    after = {p: client.get(ROOT + p, params={"stamp": "1"}).text for p in before}
    assert all(before[p] != after[p] for p in before), (before, after)
    assert f'data-version="{after[f"runs/{RUN}"]}"' in client.get(f"{ROOT}runs/{RUN}").text
    assert client.get(f"{ROOT}runs/nope", params={"stamp": "1"}).text == "error"
