"""Error responses: every refusal is a 4xx JSON body with a one-line message, never a crash.

Why: clients (the ``openai`` package included) read ``{"error": {"message", "type", "code"}}``;
a malformed body, an unknown index or a full queue must tell the caller what to change while the
server keeps serving. Unexpected exceptions become a 500 with the exception's class, logged once.

Example:
    >>> raise APIError("3000 inputs; the limit is 2048 (--max-inputs)", 413, "request_too_large")
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from neobert_embed.errors import UserInputError

if TYPE_CHECKING:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

logger = logging.getLogger("neobert_embed.serve")


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
