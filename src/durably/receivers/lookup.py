"""Answering "was this key processed, and with what result?".

An agent whose process died between sending a call and saving its result asks
the service through its tool's lookup. :func:`lookup` gives the store's answer
as a :class:`KeyRecord`; :func:`http_answer` turns it into the HTTP answer that
``durably.transports.http`` reads:

==============  ======  ============================================================
state           status  body
==============  ======  ============================================================
done            200     the original response body, with ``Idempotency-Original-Status``
in-flight       409     ``{"key", "state", "owner", "lease_until"}`` with ``Retry-After``
abandoned       410     ``{"key", "state", "owner", "lease_until"}``: its process died; unknown
rolled-back     404     ``{"key", "state", "owner", "lease_until"}``: died, effect rolled back
expired         410     ``{"key", "state"}``: seen, but the result is forgotten
not-stored      410     ``{"key", "state"}``: done, but its response was too large to keep
unknown         404     ``{"key", "state"}``: this store never saw the key
==============  ======  ============================================================

Only 404 lets an agent rerun the call, and this store answers it only when it is
certain nothing happened: for keys it never saw, and for keys whose request died
with its process on an endpoint whose effect commits with the key (rolled back
with it). An expired key keeps a tombstone and answers 410, as does a key whose
request died on any other endpoint (abandoned: it may have acted): the agent
treats 410 as "cannot tell" and passes the call to a person.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import msgspec

from ..transports.http import ORIGINAL_STATUS_HEADER
from ._keys import (
    KeyRecord,
    KeyState,
    KeyStore,
    StoredOutcome,
    StoredResponse,
    Unstored,
    valid_key,
)

__all__ = ["LookupAnswer", "http_answer", "lookup"]

_STATUS = {
    KeyState.IN_FLIGHT: 409,
    KeyState.ABANDONED: 410,
    KeyState.ROLLED_BACK: 404,
    KeyState.EXPIRED: 410,
    KeyState.UNKNOWN: 404,
}


@dataclass(frozen=True, kw_only=True)
class LookupAnswer:
    """An HTTP answer to a lookup: status, headers (lowercase names), body."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


async def lookup(store: KeyStore, key: str, *, principal: str = "") -> KeyRecord:
    """What ``store`` knows about ``key``: done (with the result), in flight, abandoned, etc.

    ``principal`` is the asker's :func:`~durably.receivers._keys.principal_digest`:
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
    said: dict[str, object] = {"key": record.key, "state": str(record.state)}
    if record.owner is not None:
        said["owner"] = record.owner
    if record.lease_until is not None:
        said["lease_until"] = record.lease_until.isoformat()
    return LookupAnswer(
        status=_STATUS.get(record.state, 500), headers=headers, body=msgspec.json.encode(said)
    )
