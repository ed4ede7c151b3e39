"""Answering "was this key processed, and with what result?".

An agent whose process died between sending a call and saving its result asks
the service through its tool's lookup. :func:`lookup` gives the store's answer
as a :class:`KeyRecord`; :func:`http_answer` turns it into the HTTP answer that
``durably.transports.http`` reads:

==============  ======  ============================================================
state           status  body
==============  ======  ============================================================
done            200     the original response body, with ``Idempotency-Original-Status``
in-flight       409     ``{"key", "state"}`` with ``Retry-After``: ask again later
expired         410     ``{"key", "state"}``: seen, but the result is forgotten
not-stored      410     ``{"key", "state"}``: done, but its response was too large to keep
unknown         404     ``{"key", "state"}``: this store never saw the key
==============  ======  ============================================================

Only 404 lets an agent rerun the call, and this store answers it only for keys
it never saw: an expired key keeps a tombstone and answers 410, which the agent
treats as "cannot tell" and passes to a person.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import msgspec

from ..transports.http import ORIGINAL_STATUS_HEADER
from ._store import (
    IdempotencyStore,
    KeyRecord,
    KeyState,
    StoredOutcome,
    StoredResponse,
    Unstored,
    valid_key,
)

__all__ = ["LookupAnswer", "http_answer", "lookup"]

_STATUS = {
    KeyState.IN_FLIGHT: 409,
    KeyState.EXPIRED: 410,
    KeyState.UNKNOWN: 404,
}


@dataclass(frozen=True, kw_only=True)
class LookupAnswer:
    """An HTTP answer to a lookup: status, headers (lowercase names), body."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


async def lookup(store: IdempotencyStore, key: str, *, principal: str = "") -> KeyRecord:
    """What ``store`` knows about ``key``: done (with the result), in flight, expired or unknown.

    ``principal`` is the asker's :func:`~durably.receivers._store.principal_digest`:
    a key is looked up within its principal's scope, so one client cannot read
    another's stored response.

    Raises:
        ValueError: the key is not 1 to 255 printable ASCII characters.
    """
    if not valid_key(key):
        raise ValueError(f"not an idempotency key: {key!r}")
    record = await store.record(key, principal=principal)
    return dataclasses.replace(record, key=key)


def http_answer(record: KeyRecord) -> LookupAnswer:
    """The HTTP answer for a looked-up key (see the module's table)."""
    result = record.result
    if record.state is KeyState.DONE and isinstance(result, StoredResponse):
        content_type = next((v for k, v in result.headers if k == "content-type"), None)
        headers = [(ORIGINAL_STATUS_HEADER.lower(), str(result.status))]
        if content_type is not None:
            headers.append(("content-type", content_type))
        return LookupAnswer(status=200, headers=headers, body=result.body)
    if record.state is KeyState.DONE and isinstance(result, StoredOutcome):
        failed = result.error is not None
        body = {"error": result.error} if failed else {"value": result.value}
        return LookupAnswer(
            status=200,
            headers=[
                (ORIGINAL_STATUS_HEADER.lower(), "500" if failed else "200"),
                ("content-type", "application/json"),
            ],
            body=msgspec.json.encode(body),
        )
    headers = [("content-type", "application/json")]
    if record.state is KeyState.DONE and isinstance(result, Unstored):
        return LookupAnswer(
            status=410,
            headers=headers,
            body=msgspec.json.encode({"key": record.key, "state": "not-stored"}),
        )
    if record.state is KeyState.IN_FLIGHT:
        headers.append(("retry-after", "1"))
    return LookupAnswer(
        status=_STATUS.get(record.state, 500),
        headers=headers,
        body=msgspec.json.encode({"key": record.key, "state": str(record.state)}),
    )
