"""The console as another local user meets it: over its real socket, in a real process.

The two-user test makes a throwaway user with ``useradd`` (as tests/test_two_users.py
does) and acts as it through ``runuser``; the others open raw connections to the
console to hold them half-sent, or ask for a page while a long one renders.
"""

from __future__ import annotations

import itertools
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from _console_process import SERVE, Console
from _console_runs import LONG, RUN, many_calls_run, paused_run

from _helpers.patience import stretched
from _helpers.two_users import NEEDS_TWO_USERS, as_user

pytestmark = pytest.mark.slow


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """A run directory (0700, the user's own) holding one paused run."""
    paused_run(tmp_path / "runs")
    return tmp_path / "runs"


@pytest.fixture
def consoles() -> Iterator[list[Console]]:
    """Consoles a test starts; each is stopped after it."""
    started: list[Console] = []
    yield started
    for console in started:
        console.stop()


def get(url: str) -> tuple[int, str]:
    """The status and body of a GET, errors included."""
    try:
        with urllib.request.urlopen(url, timeout=stretched(60)) as response:  # noqa: S310 (http://127.0.0.1)
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@NEEDS_TWO_USERS
def test_another_local_user_without_the_token_reads_nothing_of_a_run(
    runs: Path, mallory: str, consoles: list[Console]
) -> None:
    """Another user reaching the console's port gets no run data from any address without the token.

    Their curl with the token (which only the printed address carries) gets the run: the
    token, not the network, is what stands in their way.
    """
    console = Console(runs.parent, str(runs))
    consoles.append(console)
    host = f"http://127.0.0.1:{console.port}"
    paths = [
        "/",
        "/questions",
        f"/runs/{RUN}",
        f"/runs/{RUN}?fragment=1",
        f"/runs/{RUN}?stamp=1",
        f"/runs/{RUN}/text?part=task",
        "/static/console.js",
        f"/t/wrong/runs/{RUN}",
        "/?token=wrong",
    ]
    for path in paths:
        seen = as_user(mallory, f"curl -s -i --max-time 60 '{host}{path}'")
        assert seen.returncode == 0, seen.stderr
        assert seen.stdout.startswith("HTTP/1.1 403"), (path, seen.stdout[:200])
        assert "set-cookie" not in seen.stdout.lower(), path
        for secret in (RUN, "refund", "order_id", "Refunding"):
            assert secret not in seen.stdout, (path, secret)
    with_token = as_user(mallory, f"curl -s --max-time 60 '{console.url}runs/{RUN}'")
    assert "Refunding" in with_token.stdout, with_token.stdout[:300]


def test_the_access_log_never_holds_the_token(runs: Path, consoles: list[Console]) -> None:
    """With ``DURABLY_CONSOLE_LOG=info`` the access log shows each request, its token as ``…``."""
    console = Console(runs.parent, str(runs), env={"DURABLY_CONSOLE_LOG": "info"})
    consoles.append(console)
    token = console.url.rstrip("/").rsplit("/", 1)[1]
    for path in ("", "questions", f"runs/{RUN}", f"runs/{RUN}?stamp=1", f"runs/{RUN}?saved=c1"):
        assert get(console.url + path)[0] == 200
    assert get(f"http://127.0.0.1:{console.port}/t/{token}")[0] == 200  # redirected to .../
    output = console.stop()

    assert f'"GET /t/…/runs/{RUN} HTTP/1.1" 200' in output, output
    assert f'"GET /t/…/runs/{RUN}?stamp=1 HTTP/1.1" 200' in output
    assert token not in output


def serve(runs: Path, *, header_timeout: float, max_connections: int) -> Console:
    """A console through ``serve`` with these bounds."""
    command = [sys.executable, "-c", SERVE, str(runs), str(header_timeout), str(max_connections)]
    return Console(runs.parent, command=command)


def closed_within(connection: socket.socket, seconds: float) -> float | None:
    """How long until the server closed ``connection`` (None: still open after ``seconds``)."""
    started = time.monotonic()
    connection.settimeout(seconds)
    try:
        while connection.recv(4096):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - started


def trickled_until_closed(connection: socket.socket, seconds: float) -> float | None:
    """Send a request head a byte each 0.2 s; how long until the server closed it (None: never)."""
    started = time.monotonic()
    connection.settimeout(0.2)
    for byte in b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X: y\r\n" * 1000:
        if time.monotonic() - started > seconds:
            return None
        try:
            connection.sendall(bytes([byte]))
            if connection.recv(1) == b"":
                break
        except TimeoutError:
            continue  # nothing to read yet: still open
        except OSError:
            break  # reset by the server
    return time.monotonic() - started


def test_a_half_sent_request_is_closed_within_the_header_timeout(
    runs: Path, consoles: list[Console]
) -> None:
    """A request head that never ends, or that trickles in a byte at a time, is cut off."""
    console = serve(runs, header_timeout=1.0, max_connections=64)
    consoles.append(console)
    address = ("127.0.0.1", console.port)

    silent = socket.create_connection(address)
    half = socket.create_connection(address)
    half.sendall(b"GET /t/x/ HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    for connection in (silent, half):
        waited = closed_within(connection, 30)
        assert waited is not None, "a half-sent request was still open after 30 s"
        connection.close()

    trickle = socket.create_connection(address)
    assert trickled_until_closed(trickle, 30) is not None, "a trickled request head kept going"
    trickle.close()

    # A whole request is served as before, and a keep-alive connection is closed when idle.
    assert get(console.url)[0] == 200


def test_connections_beyond_the_limit_are_closed_at_once(
    runs: Path, consoles: list[Console]
) -> None:
    """With ``max_connections`` open, one more is closed; once they go, requests are served."""
    console = serve(runs, header_timeout=600.0, max_connections=3)
    consoles.append(console)
    address = ("127.0.0.1", console.port)
    held = [socket.create_connection(address) for _ in range(3)]
    time.sleep(0.5)  # let the console accept them; the next one is the fourth either way

    extra = socket.create_connection(address)
    assert closed_within(extra, 30) is not None, "a fourth connection was kept open"
    extra.close()
    for connection in held:
        assert closed_within(connection, 0.5) is None  # the three held ones are still open
        connection.close()

    deadline = time.monotonic() + stretched(30)
    while True:  # the console notices the closed connections as its loop gets to them
        try:
            assert get(console.url)[0] == 200
            break
        except (urllib.error.URLError, ConnectionError):
            assert time.monotonic() < deadline, "the console served nothing after the others left"
            time.sleep(0.2)


def test_a_long_run_renders_while_other_requests_are_answered(
    tmp_path: Path, consoles: list[Console]
) -> None:
    """Rendering a long run's page does not stop the event loop: small requests go on meanwhile."""
    many_calls_run(tmp_path / "runs", 8000)
    console = Console(tmp_path, "runs")
    consoles.append(console)
    assert get(console.url)[0] == 200  # the listing index is written before timing anything

    answered: list[float] = []
    done = threading.Event()

    def small_requests() -> None:
        while not done.is_set():
            assert get(f"http://127.0.0.1:{console.port}/")[0] == 403
            answered.append(time.monotonic())

    asker = threading.Thread(target=small_requests)
    asker.start()
    time.sleep(0.5)
    started = time.monotonic()
    status, page = get(f"{console.url}runs/{LONG}")
    ended = time.monotonic()
    done.set()
    asker.join(timeout=stretched(60))

    assert status == 200
    assert page.count('class="call"') == 8000 * 5 + 1
    during = [started, *[t for t in answered if started < t < ended], ended]
    longest = max(b - a for a, b in itertools.pairwise(during))
    # Rendered on the event loop, nothing else is answered for most of the request.
    assert longest < (ended - started) / 3, (longest, ended - started, len(during))
