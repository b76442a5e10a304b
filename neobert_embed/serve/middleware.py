"""The server's edge: request-size limit and per-request metrics, as one pure ASGI middleware.

Why: a 5 MB body must be refused (413) before it is parsed, whether or not the client declared a
Content-Length, and every response, errors included, must be counted and timed. A pure ASGI
middleware does both without the per-request cost of Starlette's ``BaseHTTPMiddleware``.

Example:
    >>> app = EdgeMiddleware(fastapi_app, metrics=ServeMetrics(), max_body=2_000_000)
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from neobert_embed.serve.errors import error_response
from neobert_embed.serve.metrics import ServeMetrics

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Send

Scope = dict[str, Any]
DRAIN_LIMIT = 64 * 1024 * 1024


class EdgeMiddleware:
    """Buffers request bodies up to ``max_body`` bytes (413 beyond) and records request metrics."""

    def __init__(self, app: ASGIApp, metrics: ServeMetrics, max_body: int) -> None:
        self.app = app
        self.metrics = metrics
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_and_record(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.metrics.in_progress.inc()
        try:
            replay = await self._bounded_body(scope, receive, send_and_record)
            if replay is not None:
                await self.app(scope, replay, send_and_record)
        finally:
            self.metrics.in_progress.dec()
            self.metrics.observe_request(scope.get("path", ""), status, time.perf_counter() - start)

    async def _bounded_body(self, scope: Scope, receive: Receive, send: Send) -> Receive | None:
        """A ``receive`` replaying the whole body, or None when a 413/400 was already sent."""
        if scope.get("method") not in {"POST", "PUT", "PATCH"}:
            return receive
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and not declared.isdigit():
            await error_response(400, "Content-Length is not a number")(scope, receive, send)
            return None
        # Read the body even when it is too large (discarding it, up to DRAIN_LIMIT) so the client
        # finishes sending and reads the 413 instead of seeing a reset connection.
        chunks, size, more = [], 0, True
        while more and size <= DRAIN_LIMIT:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size <= self.max_body:
                chunks.append(chunk)
            more = message.get("more_body", False)
        if size > self.max_body:
            await error_response(413, f"request body has {size} bytes or more; the limit is {self.max_body} "
                                 "(--max-request-bytes): send fewer or shorter inputs",
                                 "request_too_large")(scope, receive, send)
            return None
        body, sent = b"".join(chunks), False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay

