"""A run's lease as a handle holds it, and the lease of the run the current task drives."""

from __future__ import annotations

import contextvars
import os
import secrets
import socket
from dataclasses import dataclass

__all__ = ["CURRENT_LEASE", "Lease", "current_lease", "default_owner"]


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
