"""Error responses: every refusal is a 4xx JSON body with a one-line message, never a crash.

Why: clients (the ``openai`` package included) read ``{"error": {"message", "type", "code"}}``;
a malformed body, an unknown index or a full queue must tell the caller what to change while the
server keeps serving. Unexpected exceptions become a 500 with the exception's class, logged once.

Example:
    >>> raise APIError(413, "3000 inputs; the limit is 2048 (--max-inputs)", "request_too_large")
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from neobert_embed.errors import UserInputError
from neobert_embed.serve.batcher import QueueFull
from neobert_embed.serve.indexes import IndexGone, UnknownIndex

if TYPE_CHECKING:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

logger = logging.getLogger("neobert_embed.serve")


class APIError(Exception):
    """An HTTP error with a message for the client."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.headers = headers or {}


def error_body(status: int, message: str, kind: str) -> bytes:
    """The JSON error body (also used by the ASGI middleware, before FastAPI is involved)."""
    return json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()


def _response(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> JSONResponse:
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


def _refusal(exc: Exception) -> tuple[int, str, str, dict[str, str] | None]:
    """Status, message, type and headers of a refused request."""
    if isinstance(exc, APIError):
        return exc.status, exc.message, exc.kind, exc.headers
    if isinstance(exc, IndexGone):
        return 503, str(exc), "index_unavailable", None
    if isinstance(exc, UnknownIndex):
        return 404, str(exc), "not_found", None
    if isinstance(exc, QueueFull):
        return 503, str(exc), "server_busy", {"Retry-After": str(exc.retry_after)}
    if isinstance(exc, UserInputError):
        return 422, str(exc), "invalid_request_error", None
    return exc.status_code, str(exc.detail), "invalid_request_error", getattr(exc, "headers", None)


def install_error_handlers(app: FastAPI) -> None:
    """Route every exception type the server raises to a JSON error response."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _response(422, _validation_message(list(exc.errors())), "invalid_request_error")

    @app.exception_handler(APIError)
    @app.exception_handler(UnknownIndex)
    @app.exception_handler(UserInputError)
    @app.exception_handler(QueueFull)
    @app.exception_handler(HTTPException)
    async def _refused(request: Request, exc: Exception) -> JSONResponse:
        return _response(*_refusal(exc))

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s", request.url.path)
        return _response(500, f"internal error ({exc.__class__.__name__}); see the server log", "server_error")
