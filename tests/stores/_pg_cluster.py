"""A throwaway PostgreSQL cluster for tests and benchmarks: initdb, pg_ctl, gone afterwards.

The cluster lives in a fresh temp directory, listens on a free loopback port and
on a Unix socket in that directory, trusts local connections, and runs with
``fsync=on`` (a commit that returned is on disk). ``initdb`` refuses to run as
root, so when the tests run as root (as in CI containers) every server command
runs as ``nobody`` through ``runuser`` (or ``setpriv`` where runuser is missing),
and the directory is handed to that user first.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from _helpers.patience import stretched

UNPRIVILEGED = "nobody"


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    if not candidates:
        raise RuntimeError(f"{name} not found: install PostgreSQL (the server package)")
    return candidates[0]


def _as_server_user() -> list[str]:
    """The command prefix that runs a server command as an unprivileged user when we are root."""
    if os.geteuid() != 0:
        return []
    if shutil.which("runuser"):
        return ["runuser", "-u", UNPRIVILEGED, "--"]
    user = pwd.getpwnam(UNPRIVILEGED)
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Cluster:
    """A running throwaway cluster; :meth:`stop` removes every trace of it."""

    root: Path
    port: int

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    @property
    def dsn(self) -> str:
        """A libpq connection string for the ``postgres`` database as the superuser."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    @classmethod
    def start(cls, *, settings: dict[str, str] | None = None) -> Cluster:
        """Run ``initdb`` in a temp directory and start the server; wait until it accepts."""
        root = Path(tempfile.mkdtemp(prefix="durably-pg-"))
        if os.geteuid() == 0:
            user = pwd.getpwnam(UNPRIVILEGED)
            os.chown(root, user.pw_uid, user.pw_gid)
        cluster = cls(root=root, port=free_port())
        try:
            cluster._server(
                _binary("initdb"),
                "-D",
                str(cluster.data),
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",  # initdb's own files; the server below runs with fsync=on
            )
            options = {
                "listen_addresses": "127.0.0.1",
                "fsync": "on",
                "max_connections": "200",
                **(settings or {}),
            }
            with (cluster.data / "postgresql.auto.conf").open("a") as conf:
                for name, value in options.items():
                    conf.write(f"{name} = '{value}'\n")
            cluster._pg_ctl("start")
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _server(self, *args: str) -> None:
        done = subprocess.run(
            [*_as_server_user(), *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=stretched(120),
        )
        if done.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(
                f"{' '.join(args[:2])} failed ({done.returncode}):\n{done.stdout}\n"
                f"{done.stderr}\n{log[-3000:]}"
            )

    def _pg_ctl(self, action: str, *extra: str) -> None:
        self._server(
            _binary("pg_ctl"),
            action,
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-w",
            "-t",
            "60",
            "-o",
            f"-k {self.root} -p {self.port}",
            *extra,
        )

    def restart(self) -> None:
        """Stop the server abruptly (as a crash would) and start it again on the same port."""
        self._pg_ctl("stop", "-m", "immediate")
        self._pg_ctl("start")

    def halt(self) -> None:
        """Stop the server abruptly (as a crash would) and leave it down (see :meth:`resume`)."""
        self._pg_ctl("stop", "-m", "immediate")

    def resume(self) -> None:
        """Start the server again after :meth:`halt`, on the same port."""
        self._pg_ctl("start")

    def wait_ready(self, timeout: float = 30) -> None:
        """Wait until the server accepts connections."""
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.dsn, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        """Stop the server at once (``-m immediate``) and remove its directory."""
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError):
                self._server(_binary("pg_ctl"), "stop", "-D", str(self.data), "-m", "immediate")
        shutil.rmtree(self.root, ignore_errors=True)
