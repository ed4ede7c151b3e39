"""A run's lease as a handle holds it, and the lease of the run the current task drives."""

from __future__ import annotations

import contextvars
import os
import secrets
import socket
from dataclasses import dataclass
from typing import Any

__all__ = ["CURRENT_LEASE", "Lease", "current_lease", "default_owner", "lost_how"]


@dataclass(frozen=True, kw_only=True)
class Lease:
    """A run's lease as one handle holds it: whose, and under which fencing token."""

    run_id: str
    token: int
    owner: str


CURRENT_LEASE: contextvars.ContextVar[Lease | None] = contextvars.ContextVar(
    "durably_current_lease", default=None
)


def current_lease() -> Lease | None:
    """The lease of the Postgres run the current task drives, or None.

    A tool whose service can check a fencing token (reject requests carrying a
    token lower than one it has seen for the run) sends ``current_lease().token``:
    that closes the one window leases cannot, a process that stalls between its
    attempt save and the request while another process takes the run over.
    """
    return CURRENT_LEASE.get()


def default_owner() -> str:
    """This process, as a lease names its owner: host, PID and a random tag."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def lost_how(row: tuple[Any, ...] | None, token: int, why: str, me: str) -> str:
    """What became of a lost lease, for ``LeaseLost``: it lapsed, or who took the run since.

    Args:
        row: the run's ``owner``, ``token`` and whether its lease is live now
            (:data:`~durably.postgres._sql.HOLDER`), or None if the row is gone.
        token: the fencing token of the lost lease.
        why: how the handle found out.
        me: this store's owner name.
    """
    if row is None:
        return f"is gone with its row (deleted; {why}); nothing was written; stop here"
    owner, now_token, live = row[0], int(row[1]), bool(row[2])
    if now_token == token:
        if live:  # this process gave up by its own clock, before the database's expiry
            cause = f"lapsed ({why}; the database has not seen it expire yet)"
        else:
            cause = "lapsed (it expired by the database clock before a renewal reached it)"
        return (
            f"{cause} and no other worker has taken the run since; nothing was written; "
            "stop here, a worker claims the run again"
        )
    if owner == me:
        return (
            f"lapsed and this worker claimed the run again (token {now_token}); nothing was "
            "written through the old lease; stop here, the new claim carries on"
        )
    return (
        f"lapsed and was taken over by {owner} (token {now_token}); nothing was written; "
        "stop here, the new owner carries on"
    )
