"""The console's HTTP connections, bounded: a deadline for each request, a cap on connections.

uvicorn (0.55) has neither: its keep-alive timer is armed only after a response,
so a connection that sends half a request head, or nothing, is held forever, and
``limit_concurrency`` answers 503 to a *complete* request but never closes a
connection. Another local user could hold every descriptor of the console that
way. This subclass of uvicorn's h11 protocol adds both bounds:

- a deadline from the moment a connection opens (and again from the first byte
  of each later request) until the request has arrived whole, head and body;
  the connection is closed when it passes, however the bytes trickle in;
- at most ``max_connections`` open connections: one more is closed at once.

h11 already bounds a request head's size (16 KiB, ``h11_max_incomplete_event_size``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["bounded_h11"]

_logger = logging.getLogger("uvicorn.error")
_WAITING = (h11.IDLE, h11.SEND_BODY)
"""h11 states of the client while its request has not arrived whole."""


class _BoundedH11(H11Protocol):
    header_timeout: float
    max_connections: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            _logger.warning("closed a connection: %d are open already", self.max_connections)
            transport.close()
            return
        self._watch()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_watching()
        super().connection_lost(exc)

    def _watch(self) -> None:
        # Armed while the client owes the rest of a request, never re-armed by more
        # bytes of it: one byte a second does not keep a connection alive.
        if self.transport.is_closing():
            self._stop_watching()
        elif self.conn.their_state in _WAITING:
            if self._deadline is None:
                self._deadline = self.loop.call_later(self.header_timeout, self._expired)
        else:
            self._stop_watching()

    def _stop_watching(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if not self.transport.is_closing() and self.conn.their_state in _WAITING:
            _logger.info(
                "closed a connection: its request did not arrive within %ss", self.header_timeout
            )
            self.transport.close()


def bounded_h11(*, header_timeout: float, max_connections: int) -> type[H11Protocol]:
    """The h11 protocol of uvicorn with a request deadline and a connection cap (``Config(http=)``).

    Args:
        header_timeout: seconds a connection has to send a whole request, from when it
            opens or from the first byte of a later request on it.
        max_connections: open connections at most; one more is closed at once.
    """
    return type(
        "BoundedH11",
        (_BoundedH11,),
        {"header_timeout": header_timeout, "max_connections": max_connections},
    )
