"""The CPU a local PostgreSQL server has used, read from ``/proc`` (for the benchmarks)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["postmaster_pid", "server_cpu"]

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int | str) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (empty if the process is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return []


def ticks(pid: int, *, children: bool = False) -> int:
    """A process's CPU ticks (user + system), and its reaped children's with ``children``."""
    fields = _stat(pid)
    if not fields:
        return 0
    # After the command: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
    own = int(fields[11]) + int(fields[12])
    return own + (int(fields[13]) + int(fields[14]) if children else 0)


def postmaster_pid(data: Path) -> int:
    """The postmaster's PID, from the data directory's ``postmaster.pid``."""
    return int((data / "postmaster.pid").read_text().split()[0])


def server_cpu(postmaster: int) -> float:
    """CPU seconds the server has used: the postmaster, its live children and its exited ones.

    A backend that exited is counted in the postmaster's ``cutime + cstime`` once it is
    reaped, so a difference of two readings holds the backends that came and went.
    """
    total = ticks(postmaster, children=True)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(entry)
            if fields and int(fields[1]) == postmaster:
                total += ticks(int(entry))
    return total / TICK
