"""The key database is trusted as the stores trust their files, and a principal's keys are
its own whatever the key's characters (issue 31, items 4 and 5).
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from mcp.server.mcpserver import Context
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from _helpers.two_users import NEEDS_TWO_USERS
from _helpers.two_users import as_user as run_as
from durably import UnsafePath
from durably.receivers import IdempotencyMiddleware, IdempotencyStore, KeyState, deduplicated
from durably.receivers._store import FORMAT, principal_digest
from durably.receivers.asgi import Scope
from durably.receivers.mcp import META_KEY


def as_user(user: str, script: str) -> None:
    """Run a shell script as ``user``; it must succeed."""
    done = run_as(user, script)
    assert done.returncode == 0, done.stderr


@NEEDS_TWO_USERS
def test_a_key_database_or_side_file_another_user_made_is_refused(
    mallory: str, shared: Path, tmp_path: Path
) -> None:
    """Another user's 0666 keys.sqlite3, or its -wal or -shm beside the service's own database,
    is UnsafePath naming the file and its owner; so is a database in a directory others can
    write (where they could make those files). Nothing of theirs is changed.
    """
    umask = "umask 000 &&"
    as_user(mallory, f"{umask} echo > {shared / 'keys.sqlite3'}")
    with pytest.raises(UnsafePath, match=f"refusing to use {shared}: .* mode 1777"):
        IdempotencyStore(shared / "keys.sqlite3")

    for planted in ("keys.sqlite3", "keys.sqlite3-wal", "keys.sqlite3-shm"):
        mine = tmp_path / planted.replace(".", "-")
        mine.mkdir(mode=0o700)
        if planted != "keys.sqlite3":
            IdempotencyStore(mine / "keys.sqlite3").close()  # the service's own database
        theirs = shared / planted
        theirs.unlink(missing_ok=True)
        as_user(mallory, f"{umask} : > {theirs} && chmod 666 {theirs}")
        shutil.move(theirs, mine / planted)  # keeps its owner, as a once-open directory would
        before = sorted(p.name for p in mine.iterdir())
        with pytest.raises(UnsafePath) as refused:
            IdempotencyStore(mine / "keys.sqlite3")
        assert refused.value.path == str(mine / planted)
        assert f"({mallory}) with mode 0666" in str(refused.value)
        info = (mine / planted).stat()
        assert (stat.S_IMODE(info.st_mode), info.st_size) == (0o666, 0)
        assert sorted(p.name for p in mine.iterdir()) == before


def test_a_symlink_at_the_key_database_is_refused_and_its_target_untouched(
    tmp_path: Path,
) -> None:
    """keys.sqlite3 -> a file elsewhere is UnsafePath; the target keeps its bytes and mode."""
    target = tmp_path / "elsewhere.txt"
    target.write_bytes(b"precious\n")
    target.chmod(0o644)
    (tmp_path / "service").mkdir(mode=0o700)
    link = tmp_path / "service" / "keys.sqlite3"
    link.symlink_to(target)
    with pytest.raises(UnsafePath, match="a symlink"):
        IdempotencyStore(link)
    assert target.read_bytes() == b"precious\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert sorted(p.name for p in link.parent.iterdir()) == ["keys.sqlite3"]


def account(scope: Scope) -> str | None:
    """The account a request's token names, as a service's own authentication would say."""
    auth = dict(scope.get("headers", ())).get(b"authorization", b"").decode()
    return auth.removeprefix("Bearer ") or None


ALICE_SCOPED = f"{principal_digest('alice')}/K"
"""A key an anonymous client spells as format 1 stored Alice's key ``K``."""


def test_an_anonymous_key_spelling_a_scoped_one_reaches_nobody_elses_response(
    tmp_path: Path,
) -> None:
    """With ``principal=`` naming accounts, an anonymous POST with key ``<digest("alice")>/K``
    runs as a request of its own (401), and its lookup is not Alice's body.
    """

    async def orders(request: Request) -> Response:
        if "authorization" not in request.headers:
            return JSONResponse({"error": "log in"}, status_code=401)
        return JSONResponse({"order": 1, "secret": "alice's address"}, status_code=201)

    async def body() -> list[httpx.Response]:
        store = IdempotencyStore(tmp_path / "keys.sqlite3")
        app = Starlette(routes=[Route("/orders", orders, methods=["POST"])])
        service = IdempotencyMiddleware(
            app, store=store, principal=account, lookup_path="/idempotency"
        )
        transport = httpx.ASGITransport(app=service)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://shop") as client:
                alice = await client.post(
                    "/orders",
                    json={"item": "widget"},
                    headers={"Idempotency-Key": "K", "Authorization": "Bearer alice"},
                )
                anonymous = await client.post(
                    "/orders", json={"item": "widget"}, headers={"Idempotency-Key": ALICE_SCOPED}
                )
                looked_up = await client.get(f"/idempotency/{principal_digest('alice')}/K")
                return [alice, anonymous, looked_up]
        finally:
            store.close()

    alice, anonymous, looked_up = asyncio.run(body())
    assert alice.status_code == 201
    assert anonymous.status_code == 401
    assert "idempotent-replayed" not in anonymous.headers
    assert "alice" not in anonymous.text
    assert looked_up.status_code == 200  # the anonymous request's own 401, not Alice's body
    assert looked_up.headers["idempotency-original-status"] == "401"
    assert "alice" not in looked_up.text


def test_an_anonymous_mcp_key_spelling_a_scoped_one_is_a_new_call(tmp_path: Path) -> None:
    """The MCP helper with ``principal=`` naming users: the anonymous call with key
    ``<digest("alice")>/K`` runs, and never receives Alice's result.
    """
    store = IdempotencyStore(tmp_path / "keys.sqlite3")
    placed: list[str | None] = []

    def user(ctx: Any) -> str | None:
        who: str | None = ctx.user
        return who

    async def place(item: str, ctx: Context) -> str:
        placed.append(ctx.user)  # type: ignore[attr-defined]
        return f"order {len(placed)} for {ctx.user}"  # type: ignore[attr-defined]

    tool = deduplicated(store, principal=user)(place)

    def context(who: str | None, key: str) -> Any:
        return SimpleNamespace(user=who, request_context=SimpleNamespace(meta={META_KEY: key}))

    async def body() -> list[str]:
        return [
            await tool("widget", context("alice", "K")),
            await tool("widget", context(None, ALICE_SCOPED)),
        ]

    try:
        results = asyncio.run(body())
    finally:
        store.close()
    assert results == ["order 1 for alice", "order 2 for None"]
    assert placed == ["alice", None]


def test_a_format_1_key_database_is_migrated_keeping_every_key(tmp_path: Path) -> None:
    """A key table written by the previous version (one ``key`` column, ``<digest>/<key>`` for
    a principal) opens, and each stored key still answers for its own principal only.
    """
    path = tmp_path / "keys.sqlite3"
    old = sqlite3.connect(path)
    old.executescript(
        "CREATE TABLE durably_idempotency (key TEXT PRIMARY KEY, fingerprint TEXT NOT NULL,"
        " token TEXT NOT NULL, state TEXT NOT NULL, started_at REAL NOT NULL,"
        " finished_at REAL, result BLOB) WITHOUT ROWID; PRAGMA user_version = 1;"
    )
    now = 4102444800.0  # far ahead, so nothing has expired
    stored = b'{"type":"mcp","value":"done"}'
    rows = [(f"{principal_digest('alice')}/K", "running"), ("a/b", "done"), ("plain", "done")]
    for key, state in rows:
        old.execute(
            "INSERT INTO durably_idempotency VALUES (?, 'f', 't', ?, ?, ?, ?)",
            (
                key,
                state,
                now,
                now if state == "done" else None,
                stored if state == "done" else None,
            ),
        )
    old.commit()
    old.close()
    path.chmod(0o600)

    async def body() -> list[KeyState]:
        store = IdempotencyStore(path)
        try:
            return [
                (await store.record("K", principal=principal_digest("alice"))).state,
                (await store.record("K")).state,
                (await store.record("a/b")).state,
                (await store.record("plain")).state,
                (await store.record("plain", principal=principal_digest("alice"))).state,
            ]
        finally:
            store.close()

    assert asyncio.run(body()) == [
        KeyState.IN_FLIGHT,
        KeyState.UNKNOWN,
        KeyState.DONE,
        KeyState.DONE,
        KeyState.UNKNOWN,
    ]
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone() == (FORMAT,)
