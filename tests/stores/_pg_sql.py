"""The Postgres tests' shortcuts: a statement on its own connection, a scenario on a fresh store."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

import psycopg

from durably.postgres import PostgresStore

T = TypeVar("T")


def run(dsn: str, scenario: Callable[..., Awaitable[T]], *, lease: float = 30, **kw: Any) -> T:
    """Run ``scenario(store)`` on a fresh store in a new event loop."""

    async def main() -> T:
        async with PostgresStore(
            dsn, lease=timedelta(seconds=lease), renew_every=timedelta(seconds=lease / 4), **kw
        ) as store:
            return await scenario(store)

    return asyncio.run(main())


def sql(dsn: str, query: str, *params: object) -> list[tuple[Any, ...]]:
    """Run ``query`` on its own connection; the rows, if it returns any."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(query.encode(), params or None)
        return cursor.fetchall() if cursor.description else []
