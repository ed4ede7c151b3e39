"""The console's routes, its token, and the uvicorn server that runs it.

Every address the console serves starts with ``/t/<token>/``, the token printed
at start (new at every start): the pages, their polls, the whole texts, the
static files and the answer route. Any other address gets a page that says to
open the printed one, and nothing of a run (another local user can reach
127.0.0.1 too). The token is kept in no cookie: cookies ignore ports, so one
would reach every other server on the host. Links are written with the prefix,
forms post under it (another site cannot answer without the token), and the
access log shows ``/t/…/`` instead of it. ``read_only`` registers no write
route at all. A ``rerun`` answer is saved only with its form's confirmation
(``confirm=rerun``): a rerun of a call that did happen does it twice. Only the
hosts the console was started for are served (a DNS-rebinding page cannot read
it), and the Content-Security-Policy allows the console's own script only.

Pages are rendered in a worker thread, so a long run does not stop the event
loop, and the open page polls a change stamp (``?stamp=1``, a few bytes) and
fetches itself again only when the stamp changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import logging
import os
import secrets
import socket
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from ..decisions import answer, parse_answer
from ..errors import AnswerRefused, DurablyError, InvalidRunId, OwnershipError, RunNotFound
from ..listing import RunSummary, list_runs, summarize
from ..state import RunState
from ..storechoice import StoreChoice, opened_store
from ..stores import Store
from ..stores.directory import DirectoryStore
from .pages import (
    CONFIRM,
    FileCheck,
    Page,
    error_page,
    locked_page,
    questions_page,
    questions_version,
    run_page,
    runs_page,
    runs_version,
    version_of,
    whole_text,
)

__all__ = ["HEADER_TIMEOUT", "MAX_CONNECTIONS", "create_app", "serve"]

HEADER_TIMEOUT = 10.0
"""Seconds a connection has to send a whole request: a browser on loopback sends its
request at once; a half-sent one must not hold a descriptor (issue 31)."""
MAX_CONNECTIONS = 64
"""Open connections at most: a browser opens about six per host, so room for many
tabs and scripts, and a bound on the descriptors another local user can take."""

_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _html(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers=_HEADERS)


def _plain(text: str, status: int = 200) -> PlainTextResponse:
    return PlainTextResponse(text, status_code=status, headers=_HEADERS)


class _TokenGate:
    """Serves ``/t/<token>/...`` to the app below (as its root path), and nothing else.

    Every other address, a wrong token included, gets :func:`locked_page` (403)
    before any route runs: no page, poll, text or static file without the token.
    """

    def __init__(self, app: ASGIApp, *, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        given, slash, _ = path[3:].partition("/") if path.startswith("/t/") else ("", "", "")
        known = hmac.compare_digest(given.encode(), self.token)
        if known and not slash:
            response: Response = RedirectResponse(path + "/", status_code=307, headers=_HEADERS)
        elif known:
            scope = {**scope, "root_path": scope.get("root_path", "") + "/t/" + given}
            await self.app(scope, receive, send)
            return
        else:
            response = _html(locked_page(), 403)
        await response(scope, receive, send)


def _check_files(root: Path, recorded: dict[str, str]) -> list[FileCheck]:
    checks = []
    base = root.resolve()
    for path, digest in sorted(recorded.items()):
        target = (base / path).resolve()
        if not target.is_relative_to(base):
            status = "not checked"  # a recorded path that leaves the workspace: never read it
        elif not target.is_file():
            status = "missing"
        else:
            found = hashlib.sha256(target.read_bytes()).hexdigest()
            status = "matches" if found == digest else "changed"
        checks.append(FileCheck(path=path, recorded=digest, status=status))
    return checks


def _saved(state: RunState, call_id: str | None) -> str | None:
    """The "answer saved" notice for ``call_id``, only when the run holds an answer to it.

    The notice is worded from the decision in the store, never from the address:
    ``?saved=`` naming anything else shows nothing (issue 31).
    """
    if not call_id:
        return None
    decision = state.decisions.get(call_id) or state.approvals_given.get(call_id)
    if decision is not None:
        text = "approved" if decision.approved else "refused"
        return f"answer to {call_id} saved: {text}" + (f" by {decision.by}" if decision.by else "")
    resolution = state.resolutions.get(call_id)
    if resolution is not None and resolution.step == 3:
        return f"answer to {call_id} saved: {resolution.outcome}" + (
            f" by {resolution.by}" if resolution.by else ""
        )
    return None


def create_app(  # noqa: C901, PLR0915 - one closure per route over the same store; each route is short, their sum counts here
    choice: StoreChoice,
    *,
    token: str,
    read_only: bool = False,
    workspace: str | None = None,
    hosts: Sequence[str] = ("127.0.0.1", "localhost", "::1", "[::1]"),
) -> Starlette:
    """The console as an ASGI app over the store ``choice`` names.

    Args:
        choice: the store.
        token: the secret every address carries (``/t/<token>/``).
        read_only: serve no write route.
        workspace: where a run's workspace is, with ``{run}`` for the run ID; None
            when unknown (the files are listed, not checked).
        hosts: the Host header values served.
    """
    stores: list[Store] = []

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with opened_store(choice) as store:
            stores.append(store)
            yield

    def page(request: Request, **extra: Any) -> Page:
        return Page(
            store=choice.describe(),
            root=request.scope.get("root_path", "") + "/",
            read_only=read_only,
            **extra,
        )

    async def states() -> tuple[list[RunSummary], list[str]]:
        # The runs' summaries: through the listing index on a file store, so a
        # poll every 1.5 s costs a directory listing, not a load of every run.
        listed = await list_runs(stores[0])
        problems = [f"{run_id}: {exc}" for run_id, exc in listed.unreadable]
        found = sorted(listed.summaries, key=lambda s: s.created_at, reverse=True)
        return found, problems

    def stamp_asked(request: Request) -> bool:
        return "stamp" in request.query_params

    async def runs(request: Request) -> Response:
        phase = request.query_params.get("phase") or None
        found, problems = await states()
        if stamp_asked(request):
            return _plain(runs_version(found, problems, phase))
        text = await asyncio.to_thread(runs_page, page(request), found, problems, phase)
        return _html(text)

    async def open_questions(request: Request) -> Response:
        found, problems = await states()
        if stamp_asked(request):
            return _plain(questions_version(found))
        return _html(await asyncio.to_thread(questions_page, page(request), found, problems))

    async def run_stamp(run_id: str) -> str:
        # What the run page's version is made of (phase, last save) without loading the
        # run: a file store's listing index has it, so polling a 100 MB run reads nothing.
        if isinstance(stores[0], DirectoryStore):
            listed = await list_runs(stores[0])
            summary = next((s for s in listed.summaries if s.run_id == run_id), None)
        else:
            try:
                summary = summarize(await stores[0].read(run_id))
            except (RunNotFound, InvalidRunId):
                summary = None
        return "error" if summary is None else version_of([summary])

    def render_run(shown: Page, state: RunState) -> str:
        # In a worker thread: hashing workspace files and rendering a long run take time.
        run_id = state.run_id
        checks = None
        if state.workspace and workspace is not None:
            checks = _check_files(Path(workspace.replace("{run}", run_id)), state.workspace)
        elif state.workspace:
            checks = [
                FileCheck(path=p, recorded=d, status="not checked")
                for p, d in sorted(state.workspace.items())
            ]
        return run_page(shown, state, checks)

    async def one_run(request: Request, *, notice: str | None = None) -> Response:
        run_id = request.path_params["run_id"]
        try:
            state = await stores[0].read(run_id)
        except (RunNotFound, InvalidRunId) as exc:
            return _html(error_page(page(request), "no such run", str(exc)), 404)
        except DurablyError as exc:
            return _html(error_page(page(request), "unreadable run", str(exc)), 500)
        saved = None if notice else _saved(state, request.query_params.get("saved"))
        shown = page(request, notice=notice, saved=saved)
        text = await asyncio.to_thread(render_run, shown, state)
        return _html(text, 409 if notice else 200)

    async def answer_route(request: Request) -> Response:
        form = await request.form()
        run_id = request.path_params["run_id"]
        call_id = str(form.get("call") or "")
        word = str(form.get("answer") or "")
        reason = str(form.get("reason") or "").strip() or None
        result = str(form.get("result") or "").strip() or None
        if word.strip().lower() == "rerun" and form.get("confirm") != CONFIRM:
            # A post without the form's checkbox (a script, an old page, a slip): a rerun
            # of a call that did happen does it twice, so it is never taken unconfirmed.
            return await one_run(
                request,
                notice="answer not saved: a rerun must be confirmed: tick the box that says "
                "what it may repeat (if the call did happen, a rerun does it twice)",
            )
        try:
            decision = parse_answer(word, reason=reason, result=result)
            await answer(stores[0], run_id=run_id, call_id=call_id, decision=decision, by="console")
        except ValueError as exc:
            return await one_run(request, notice=f"answer not saved: {exc}")
        except AnswerRefused as exc:
            return await one_run(request, notice=f"answer not saved: {exc.reason}")
        except OwnershipError:
            return await one_run(
                request,
                notice="answer not saved: another process holds the run right now; try again",
            )
        target = f"{page(request).root}runs/{quote(run_id)}?saved={quote(call_id)}"
        return RedirectResponse(target, status_code=303, headers=_HEADERS)

    async def run_route(request: Request) -> Response:
        if stamp_asked(request):
            return _plain(await run_stamp(request.path_params["run_id"]))
        return await one_run(request)

    async def text_route(request: Request) -> Response:
        # The whole of a text the page cut: plain text, which no browser runs.
        run_id = request.path_params["run_id"]
        part = request.query_params.get("part", "")
        try:
            state = await stores[0].read(run_id)
        except (RunNotFound, InvalidRunId) as exc:
            return _plain(f"no such run: {exc}", 404)
        text = whole_text(state, part)
        if text is None:
            return _plain(f"run {run_id} has no text {part!r}", 404)
        return _plain(text)

    routes: list[Route | Mount] = [
        Route("/", runs),
        Route("/questions", open_questions),
        Route("/runs/{run_id}", run_route),
        Route("/runs/{run_id}/text", text_route),
        Mount(
            "/static",
            app=StaticFiles(directory=Path(__file__).parent / "static"),
            name="static",
        ),
    ]
    if not read_only:
        routes.append(Route("/runs/{run_id}/answer", answer_route, methods=["POST"]))

    async def store_failed(request: Request, exc: Exception) -> Response:
        # The store itself failed (a database outage, an unreadable directory): say so
        # on the page, keep serving, and let the next poll try again.
        return _html(error_page(page(request), "the store failed", str(exc)), 503)

    return Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={DurablyError: store_failed},
        middleware=[
            Middleware(TrustedHostMiddleware, allowed_hosts=list(hosts)),
            Middleware(_TokenGate, token=token),
        ],
    )


class _Redact(logging.Filter):
    """Writes ``…`` for the token in every record of uvicorn's logs (the access log's paths)."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self.token = token

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self.token in message:
            record.msg, record.args = message.replace(self.token, "…"), None
        return True


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve(
    choice: StoreChoice,
    *,
    host: str = "127.0.0.1",
    port: int = 8470,
    read_only: bool = False,
    workspace: str | None = None,
    say: Callable[[str], None] = print,
    header_timeout: float = HEADER_TIMEOUT,
    max_connections: int = MAX_CONNECTIONS,
) -> None:
    """Bind, print the address (it carries the token), and serve until interrupted.

    Args:
        choice: the store.
        host: the address to listen on.
        port: the port (0: any free one).
        read_only: serve no write route.
        workspace: as for :func:`create_app`.
        say: where the address and warnings are written.
        header_timeout: seconds a connection has to send a whole request.
        max_connections: open connections at most.
    """
    import uvicorn

    from ._http import bounded_h11

    token = secrets.token_urlsafe(24)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    # Listening before the address is printed: a browser (or a script) that opens it at
    # once waits in the backlog until uvicorn accepts, instead of being refused.
    sock.listen(128)
    bound = sock.getsockname()[1]
    hosts = ["127.0.0.1", "localhost", "::1", "[::1]", host]
    app = create_app(choice, token=token, read_only=read_only, workspace=workspace, hosts=hosts)
    shown = f"[{host}]" if ":" in host else host
    if not _is_loopback(host):
        say(
            f"warning: {host} is not a loopback address: the address and its token travel "
            "unencrypted, and whoever sees them can read runs and answer"
        )
    address = f"http://{shown}:{bound}/t/{token}/"
    if read_only:
        say(f"durably console (read-only) at {address}")
        say("open that address: it carries the console's token; Ctrl-C stops")
    else:
        say(f"durably console at {address}")
        say("open that address: it carries the token that reading and answering need; Ctrl-C stops")
    sys.stdout.flush()
    config = uvicorn.Config(
        app,
        log_level=os.environ.get("DURABLY_CONSOLE_LOG", "warning"),
        http=bounded_h11(header_timeout=header_timeout, max_connections=max_connections),
    )
    redact = _Redact(token)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi"):
        logging.getLogger(name).addFilter(redact)
    uvicorn.Server(config).run(sockets=[sock])
