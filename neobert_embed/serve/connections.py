"""What the server allows a TCP connection: how long it may idle or dribble, and who may reach it.

Why: any byte cancels uvicorn's keep-alive timer, so clients sending a request one byte at a time held
sockets for ever. Here a connection must deliver a whole request within :data:`REQUEST_READ_SECONDS` of
opening or of its previous response, else it is closed (docs/serving.md states these limits).

Example:
    >>> uvicorn.run(app, host="127.0.0.1", port=8080, **connection_limits())
    >>> exposure_warning("0.0.0.0", api_key=None)
    'listening on 0.0.0.0 (beyond this machine) without an API key: ...'
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger(__name__)

KEEP_ALIVE_SECONDS = 5.0  # an idle keep-alive connection is closed after this (uvicorn's timeout_keep_alive)
REQUEST_READ_SECONDS = 30.0  # a whole request (head and body) must arrive within this
MAX_HEAD_BYTES = 64 * 1024  # request line and headers (h11_max_incomplete_event_size)


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline (``read_seconds``) for receiving each request: started when
    the connection opens and after each response, cleared once a request has fully arrived."""

    read_seconds: float = REQUEST_READ_SECONDS
    _deadline: asyncio.TimerHandle | None = None
    _answered: object = None  # the request cycle answered last (a new one has to arrive in time)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and self.cycle is not self._answered and not self.cycle.more_body:
            self._disarm()  # a new request arrived whole

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()  # the next request on this connection gets its own deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._answered = self.cycle
        if not self.transport.is_closing():
            self._deadline = self.loop.call_later(self.read_seconds, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            logger.info("closed a connection from %s: no complete request within %.0f s", self.client,
                        self.read_seconds)
            self.transport.close()


def connection_limits(read_seconds: float = REQUEST_READ_SECONDS) -> dict[str, Any]:
    """The keyword arguments of ``uvicorn.run``/``uvicorn.Config`` that bound every connection."""
    protocol = type("DeadlineH11Protocol", (DeadlineH11Protocol,), {"read_seconds": read_seconds})
    return {"http": protocol, "timeout_keep_alive": KEEP_ALIVE_SECONDS,
            "h11_max_incomplete_event_size": MAX_HEAD_BYTES}


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """The warning for a server reachable beyond this machine (not ``127.0.0.1``, ``::1``, ``localhost``)
    without an API key, or None."""
    try:
        loopback = ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        loopback = host.strip().lower() in ("localhost", "localhost.localdomain")
    if api_key or loopback:
        return None
    return (f"listening on {host} (beyond this machine) without an API key: anyone who can reach this port can "
            "use the model and read the indexes' documents; pass --api-key KEY (or set NEOBERT_EMBED_API_KEY), "
            "or --host 127.0.0.1")
