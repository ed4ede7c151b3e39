"""Run IDs and idempotency keys.

The idempotency key is derived, never random: the same run and call always give
the same key, in any process, so a retry after a crash carries the key the
receiver saw the first time.
"""

from __future__ import annotations

import re
import string
from datetime import UTC, datetime

from .errors import InvalidRunId

__all__ = ["RUN_ID_PATTERN", "idempotency_key", "new_run_id", "validate_run_id"]

RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_ALPHABET = string.ascii_lowercase + string.digits
_TASK_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def idempotency_key(run_id: str, call_id: str) -> str:
    """The idempotency key of one tool call: 32 lowercase hex digits.

    SHA-256 over each part written as the decimal length of its UTF-8 bytes, a
    colon, then the bytes; the first 16 bytes of the digest, in hex. The length
    prefixes keep ``("ab", "c")`` and ``("a", "bc")`` apart.
    """
    import hashlib  # here: reading a store validates run IDs, never hashes (OpenSSL's load)

    digest = hashlib.sha256()
    for part in (run_id, call_id):
        data = part.encode("utf-8")
        digest.update(f"{len(data)}:".encode("ascii"))
        digest.update(data)
    return digest.digest()[:16].hex()


def validate_run_id(run_id: str) -> str:
    """Return the run ID unchanged, or raise ``InvalidRunId`` before anything touches a file."""
    if not isinstance(run_id, str) or RUN_ID_PATTERN.fullmatch(run_id) is None:
        raise InvalidRunId(run_id=str(run_id))
    return run_id


def new_run_id(task: str, *, now: datetime | None = None) -> str:
    """A fresh run ID: ``<task>-<UTC time>-<8 random [a-z0-9]>``.

    The task part is cut down to the characters a run ID allows.
    """
    when = (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    slug = _TASK_UNSAFE.sub("-", task).strip("-._")[:80] or "run"
    import secrets  # here: reading a store needs keys.py, not secrets (and hmac) (issue 19)

    suffix = "".join(secrets.choice(_ALPHABET) for _ in range(8))
    return validate_run_id(f"{slug}-{when}-{suffix}")
