"""The console in a real browser (Debian's headless Chromium): answer the demo's approvals.

The demo runs with ``--approve later``, so it pauses with its questions; a person
answers them in the console; the demo's own command resumes the run (the console
never runs agents: see docs/design.md), and the open page follows the run to done
without a reload. Screenshots are saved under the directory the test prints
(``$DURABLY_SCREENSHOTS`` when set).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from _console_process import DURABLY, Console
from _console_runs import DOUBT, HOSTILE, RUN, SAID, in_doubt_run, paused_run
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from _helpers.patience import stretched
from durably.stores.file import FileStore

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def durably(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """One ``durably`` command in its own process."""
    env = {k: v for k, v in os.environ.items() if k != "DURABLY_DSN"}
    return subprocess.run(
        [*DURABLY, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=stretched(120)
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    """Headless Chromium from Debian, driven through Debian's chromedriver (nothing downloaded)."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where this test's screenshots go; printed so a CI log says where to find them."""
    root = Path(os.environ.get("DURABLY_SCREENSHOTS") or tmp_path / "screenshots")
    root.mkdir(parents=True, exist_ok=True)
    print(f"screenshots: {root}")
    return root


@pytest.fixture
def start_console(tmp_path: Path) -> Iterator[type[Console]]:
    """Start consoles with ``start(cwd, *args)``; every one is stopped after the test."""
    started: list[Console] = []

    def start(cwd: Path, *args: str) -> Console:
        console = Console(cwd, *args)
        started.append(console)
        return console

    yield start  # type: ignore[misc]
    for console in started:
        console.stop()


def full_page(driver: WebDriver, path: Path) -> None:
    """Save a screenshot of the page from its top, up to 1600 pixels of it."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, min(max(int(height) + 40, 700), 1600))
    driver.save_screenshot(str(path))
    driver.set_window_size(1280, 1000)


def wait_for(driver: WebDriver, css: str, text: str, seconds: float = 45) -> None:
    """Wait until the element at ``css`` shows ``text``."""
    WebDriverWait(driver, seconds, poll_frequency=0.2).until(
        ec.text_to_be_present_in_element((By.CSS_SELECTOR, css), text)
    )


def test_a_person_approves_the_demo_in_the_console_and_watches_it_finish(
    tmp_path: Path, browser: WebDriver, shots: Path, start_console: type[Console]
) -> None:
    """Approve both of the demo's questions in the browser; the page follows the run to done."""
    first = durably(tmp_path, "triage", "--state", "st", "--approve", "later", "--model", "replay")
    assert first.returncode == 3, first.stdout + first.stderr
    [run_id] = [p.stem for p in (tmp_path / "st" / "runs").glob("*.json")]
    console = start_console(tmp_path, "--state", "st")

    # The questions page lists the waiting approval, with its arguments and forms.
    browser.get(console.url)  # the printed address: the only way in
    browser.get(f"{console.base}/questions")
    wait_for(browser, "main h1", "Open questions (1)")
    question = browser.find_element(By.CSS_SELECTOR, ".question")
    assert "file_issue" in question.text
    assert "Done after delete crashes" in question.text
    full_page(browser, shots / "questions.png")

    question.find_element(By.CSS_SELECTOR, "button.yes").click()
    wait_for(browser, "main", "answer to")
    assert f"/runs/{run_id}" in browser.current_url
    assert "answered; the run carries on when a process resumes it" in browser.page_source

    # From here on the page is never reloaded: a marker set now must survive the updates.
    browser.execute_script("window.__stayed = 42")
    second = durably(tmp_path, "triage", "--state", "st", "--approve", "later")
    assert second.returncode == 3, second.stdout + second.stderr
    wait_for(browser, "main", "Waiting for a person (1)")
    assert "Empty title crashes" in browser.find_element(By.CSS_SELECTOR, ".question").text

    listed = durably(tmp_path, "pending", "--state", "st", "--json")
    assert "Empty title crashes" in listed.stdout
    full_page(browser, shots / "run-waiting.png")
    browser.find_element(By.CSS_SELECTOR, ".question button.yes").click()
    wait_for(browser, "main", "answer to")

    browser.execute_script("window.__stayed = 43")
    last = durably(tmp_path, "triage", "--state", "st", "--approve", "later")
    assert last.returncode == 0, last.stdout + last.stderr
    assert "16/16 checks passed" in last.stdout
    wait_for(browser, "dl.facts .phase", "done")
    assert browser.execute_script("return window.__stayed") == 43
    assert "file_issue" in browser.find_element(By.CSS_SELECTOR, "main").text
    full_page(browser, shots / "run-done.png")


def test_a_stale_answer_and_a_forged_one_are_refused_in_the_browser(
    tmp_path: Path, browser: WebDriver, shots: Path, start_console: type[Console]
) -> None:
    """A refusal typed while the CLI approved is refused with its reason; no token, no answer."""
    paused = durably(tmp_path, "triage", "--state", "st", "--approve", "later", "--model", "replay")
    assert paused.returncode == 3, paused.stdout + paused.stderr
    [run_id] = [p.stem for p in (tmp_path / "st" / "runs").glob("*.json")]
    console = start_console(tmp_path, "--state", "st")

    browser.get(console.url)
    browser.get(f"{console.base}/runs/{run_id}")
    reason = browser.find_element(By.CSS_SELECTOR, ".question input[name=reason]")
    reason.send_keys("not yet")  # the person is typing: the page holds still meanwhile
    call = browser.find_element(By.CSS_SELECTOR, ".question").get_attribute("data-call")
    assert call
    meanwhile = durably(tmp_path, "answer", run_id, call, "yes", "--state", "st")
    assert meanwhile.returncode == 0, meanwhile.stderr
    time.sleep(2)  # longer than a poll: the typed reason must still be there
    assert reason.get_attribute("value") == "not yet"
    browser.find_element(By.CSS_SELECTOR, ".question button.no").click()

    # The click posts the form: wait for the answer's page rather than read the old one.
    wait_for(browser, "[role=alert]", "answer not saved: it was already answered (approved)")
    full_page(browser, shots / "stale-answer.png")

    # A form posted to an address without the token (another site, an old tab) gets 403.
    browser.execute_script(
        "const f = document.createElement('form'); f.method = 'post';"
        "f.action = arguments[0];"
        "for (const [k, v] of [['call', arguments[1]], ['answer', 'no'], ['token', 'guess']]) {"
        "  const i = document.createElement('input'); i.name = k; i.value = v; f.append(i); }"
        "document.body.append(f); f.submit();",
        f"/t/guess/runs/{run_id}/answer",
        call,
    )
    WebDriverWait(browser, 45).until(lambda d: "carry the console's token" in d.page_source)


def test_markup_from_the_model_is_shown_as_text_in_the_browser(
    tmp_path: Path, browser: WebDriver, start_console: type[Console]
) -> None:
    """A reply holding <script> and an onerror image runs nothing; the person sees the text."""
    paused_run(tmp_path / "runs")
    console = start_console(tmp_path, "runs")

    browser.get(f"{console.base}/runs/{RUN}")
    wait_for(browser, "main h1", RUN)

    assert browser.title != "owned"
    assert HOSTILE in browser.find_element(By.CSS_SELECTOR, "pre.reply").text
    assert browser.find_elements(By.CSS_SELECTOR, "main script, main img") == []


class _Recorder(BaseHTTPRequestHandler):
    """Another user's server on another loopback port: keeps the headers of every request."""

    seen: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        _Recorder.seen.append(dict(self.headers.items()))
        body = b"<!doctype html><title>elsewhere</title><h1>elsewhere</h1>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test reads ``seen``."""


@pytest.fixture
def elsewhere() -> Iterator[str]:
    """The address of a server on another port of 127.0.0.1, recording what it receives."""
    _Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_no_other_port_of_the_host_receives_the_token(
    tmp_path: Path, browser: WebDriver, start_console: type[Console], elsewhere: str
) -> None:
    """The console sets no cookie, so a server on another loopback port never sees the token."""
    paused_run(tmp_path / "runs")
    console = start_console(tmp_path, "runs")
    token = console.url.rstrip("/").rsplit("/", 1)[1]

    browser.get(console.url)
    browser.get(f"{console.base}/runs/{RUN}")
    wait_for(browser, "main h1", RUN)
    assert browser.get_cookies() == []
    # A link followed from a console page (same site: cookies ignore ports), then the
    # other server's address typed in; each request is what another user's server gets.
    browser.execute_script("window.location.href = arguments[0]", elsewhere + "from-a-link")
    wait_for(browser, "h1", "elsewhere")
    browser.get(elsewhere + "typed")
    wait_for(browser, "h1", "elsewhere")

    assert {h.get("Host") for h in _Recorder.seen} == {elsewhere[7:-1]}
    assert len(_Recorder.seen) >= 2
    for headers in _Recorder.seen:
        assert not any(token in value for value in headers.values()), headers
        assert not any(n.lower() == "cookie" and "durably" in v for n, v in headers.items())
    browser.get(f"{console.base}/questions")
    assert browser.get_cookies() == []


def test_rerun_saves_nothing_until_the_person_confirms_what_it_may_repeat(
    tmp_path: Path, browser: WebDriver, shots: Path, start_console: type[Console]
) -> None:
    """Clicking rerun without ticking its confirmation posts nothing; ticking it saves the rerun."""
    in_doubt_run(tmp_path / "runs")
    console = start_console(tmp_path, "runs")
    store = FileStore(tmp_path / "runs")
    before = store.read_sync(DOUBT)

    browser.get(f"{console.base}/runs/{DOUBT}")
    wait_for(browser, "main h1", DOUBT)
    question = browser.find_element(By.CSS_SELECTOR, ".question")
    assert "the tool said: ToolInDoubt: " + SAID in question.text
    confirm = question.find_element(By.CSS_SELECTOR, "form.rerun-form input[name=confirm]")
    label = question.find_element(By.CSS_SELECTOR, "form.rerun-form label.confirm").text
    assert label.startswith('Run refund again? If it did happen, refund(order_id="A-17"')
    rerun = question.find_element(By.CSS_SELECTOR, "button.rerun")
    approve_green = "rgb(27, 127, 59)"
    assert rerun.value_of_css_property("background-color") != approve_green
    browser.execute_script("window.__stayed = 7")

    rerun.click()  # not confirmed: the browser's own check keeps the form from posting
    time.sleep(2)  # longer than a poll: a post would have answered by now
    assert browser.execute_script("return window.__stayed") == 7  # the page was not left
    assert browser.execute_script("return arguments[0].validity.valueMissing", confirm)
    after = store.read_sync(DOUBT)
    assert (list(after.pending), after.resolutions, after.saved_at) == (["c1"], {}, before.saved_at)
    full_page(browser, shots / "rerun-unconfirmed.png")

    confirm.click()
    rerun.click()
    wait_for(browser, "[role=status]", "answer to c1 saved: rerun by console")
    saved = store.read_sync(DOUBT)
    assert saved.pending == {}
    assert (saved.resolutions["c1"].step, saved.resolutions["c1"].outcome) == (3, "rerun")
    assert saved.resolutions["c1"].by == "console"
    full_page(browser, shots / "rerun-confirmed.png")
