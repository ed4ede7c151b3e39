"""The console's routes, its write token, and the uvicorn server that runs it.

Reading needs nothing; answering needs the token the console prints at start
(in the address it prints). Opening that address once stores the token in a
``SameSite=Strict`` cookie so the pages render their forms; each form carries
the token in a hidden field, and a POST without it is refused (403), so another
site cannot answer through the person's browser. ``read_only`` registers no
write route at all. Only the hosts the console was started for are served
(a DNS-rebinding page cannot read it), and the Content-Security-Policy allows
the console's own script only.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
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
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..decisions import answer, parse_answer
from ..errors import AnswerRefused, DurablyError, InvalidRunId, OwnershipError, RunNotFound
from ..state import RunState
from ..storechoice import StoreChoice, opened_store
from ..stores import Store
from .pages import FileCheck, Page, error_page, questions_page, run_page, runs_page

__all__ = ["create_app", "serve"]

_COOKIE = "durably_console"
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _cookie(request: Request) -> str:
    # Cookies are shared by every port of a host: two consoles on one machine must not
    # overwrite each other's token, so the name carries the port.
    return f"{_COOKIE}_{request.url.port or 80}"


def _html(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers=_HEADERS)


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


def create_app(
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
        token: the secret a write must carry.
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
        given = request.query_params.get("token") or request.cookies.get(_cookie(request)) or ""
        known = hmac.compare_digest(given.encode(), token.encode())
        return Page(
            store=choice.describe(),
            token=token if known and not read_only else None,
            read_only=read_only,
            **extra,
        )

    def respond(request: Request, text: str, status: int = 200) -> Response:
        response = _html(text, status)
        if (
            not read_only
            and request.query_params.get("token")
            and hmac.compare_digest(request.query_params["token"].encode(), token.encode())
        ):
            response.set_cookie(_cookie(request), token, httponly=True, samesite="strict", path="/")
        return response

    async def states() -> tuple[list[RunState], list[str]]:
        store = stores[0]
        found, problems = [], []
        for run_id in await store.list_runs():
            try:
                found.append(await store.read(run_id))
            except RunNotFound:
                continue  # queued on Postgres (no state yet), or removed since the listing
            except DurablyError as exc:
                problems.append(f"{run_id}: {exc}")
        found.sort(key=lambda s: s.created_at, reverse=True)
        return found, problems

    async def runs(request: Request) -> Response:
        phase = request.query_params.get("phase") or None
        found, problems = await states()
        return respond(request, runs_page(page(request), found, problems, phase))

    async def open_questions(request: Request) -> Response:
        found, problems = await states()
        return respond(request, questions_page(page(request), found, problems))

    async def one_run(request: Request, **extra: Any) -> Response:
        run_id = request.path_params["run_id"]
        try:
            state = await stores[0].read(run_id)
        except (RunNotFound, InvalidRunId) as exc:
            return respond(request, error_page(page(request), "no such run", str(exc)), 404)
        except DurablyError as exc:
            return respond(request, error_page(page(request), "unreadable run", str(exc)), 500)
        checks = None
        if state.workspace and workspace is not None:
            checks = _check_files(Path(workspace.replace("{run}", run_id)), state.workspace)
        elif state.workspace:
            checks = [
                FileCheck(path=p, recorded=d, status="not checked")
                for p, d in sorted(state.workspace.items())
            ]
        status = 409 if extra.get("notice") else 200
        return respond(request, run_page(page(request, **extra), state, checks), status)

    async def answer_route(request: Request) -> Response:
        form = await request.form()
        given = str(form.get("token") or "")
        if not hmac.compare_digest(given.encode(), token.encode()):
            return _html("<h1>403</h1><p>answers need the console's token</p>", 403)
        run_id = request.path_params["run_id"]
        call_id = str(form.get("call") or "")
        word = str(form.get("answer") or "")
        reason = str(form.get("reason") or "").strip() or None
        result = str(form.get("result") or "").strip() or None
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
        target = f"/runs/{quote(run_id)}?saved={quote(call_id)}"
        return RedirectResponse(target, status_code=303, headers=_HEADERS)

    async def run_route(request: Request) -> Response:
        saved = request.query_params.get("saved")
        return await one_run(request, saved=f"answer to {saved} saved" if saved else None)

    routes: list[Route | Mount] = [
        Route("/", runs),
        Route("/questions", open_questions),
        Route("/runs/{run_id}", run_route),
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
        middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=list(hosts))],
    )


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
) -> None:
    """Bind, print the address (with the write token), and serve until interrupted."""
    import uvicorn

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
        say(f"warning: {host} is not a loopback address: anyone who can reach it can read runs")
    if read_only:
        say(f"durably console (read-only) at http://{shown}:{bound}/")
    else:
        say(f"durably console at http://{shown}:{bound}/?token={token}")
        say("answers need that address (it carries the write token); Ctrl-C stops")
    sys.stdout.flush()
    config = uvicorn.Config(app, log_level=os.environ.get("DURABLY_CONSOLE_LOG", "warning"))
    uvicorn.Server(config).run(sockets=[sock])
