"""Refusals: every one a 4xx JSON body with a one-line message, never a crash, from the edge in.

Why: clients (the ``openai`` package included) read ``{"error": {"message", "type", "code"}}`` and must
learn what to change while the server keeps serving; an unexpected exception is a 500 naming its class.
A too-large body is refused (413) before it is parsed by :class:`EdgeMiddleware`, a pure ASGI middleware
(no per-request cost of ``BaseHTTPMiddleware``) that also counts and times every response.

Example:
    >>> app = EdgeMiddleware(fastapi_app, metrics=ServeMetrics(), max_body=2_000_000)
    >>> raise APIError("3000 inputs; the limit is 2048 (--max-inputs)", 413, "request_too_large")
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from neobert_embed.errors import UserInputError

if TYPE_CHECKING:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
    from starlette.types import ASGIApp, Receive, Scope, Send

    from neobert_embed.serve.metrics import ServeMetrics

logger = logging.getLogger("neobert_embed.serve")
DRAIN_LIMIT = 64 * 1024 * 1024  # a too-large body is read (and dropped) up to this, so the client reads the 413


class APIError(Exception):
    """An HTTP error with a message for the client; a subclass fixes its status and type."""

    status = 422
    kind = "invalid_request_error"

    def __init__(self, message: str, status: int | None = None, kind: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.headers = status or self.status, kind or self.kind, headers


def error_response(status: int, message: str, kind: str = "invalid_request_error",
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """The JSON error response (also sent by the ASGI middleware, before FastAPI is involved)."""
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status,
                        headers=headers)


def _validation_message(errors: list[dict]) -> str:
    parts = []
    for error in errors[:3]:
        if error.get("type") == "json_invalid":
            position = error.get("loc", ("body", "?"))[-1]
            reason = (error.get("ctx") or {}).get("error", "invalid JSON")
            return f"request body is not valid JSON: {reason} at character {position}"
        where = ".".join(str(part) for part in error.get("loc", ()) if part != "body") or "body"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return "invalid request body: " + "; ".join(parts) + more


def install_error_handlers(app: FastAPI) -> None:
    """Route every exception the server raises to a JSON error response."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, _validation_message(list(exc.errors())))

    @app.exception_handler(APIError)
    async def _refused(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, str(exc), exc.kind, exc.headers)

    @app.exception_handler(UserInputError)  # a prompt name the model lacks, ...
    async def _unusable(request: Request, exc: UserInputError) -> JSONResponse:
        return error_response(422, str(exc))

    @app.exception_handler(HTTPException)  # FastAPI's own: 404 for an unknown path, 405, ...
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s", request.url.path)
        return error_response(500, f"internal error ({exc.__class__.__name__}); see the server log", "server_error")


class EdgeMiddleware:
    """Buffers request bodies up to ``max_body`` bytes (413 beyond) and records request metrics."""

    def __init__(self, app: ASGIApp, metrics: ServeMetrics, max_body: int) -> None:
        self.app, self.metrics, self.max_body = app, metrics, max_body

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
        """A ``receive`` replaying the whole body, or None when a 413 was already sent."""
        if scope.get("method") not in {"POST", "PUT", "PATCH"}:
            return receive
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
        whole = iter([{"type": "http.request", "body": b"".join(chunks), "more_body": False}])

        async def replay() -> dict:
            return next(whole, None) or await receive()

        return replay

