"""Errors on the HTTP wire: TEI's JSON shape for everything, framework errors included."""

from __future__ import annotations

import logging

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from vectorpress.errors import VectorpressError

log = logging.getLogger(__name__)

#: Routes whose errors use OpenAI's error shape instead of TEI's.
OPENAI_PATHS = ("/v1/embeddings", "/embeddings")


def error_body(path: str, message: str, error_type: str, status: int) -> bytes:
    if path in OPENAI_PATHS:
        return orjson.dumps({"message": message, "code": status, "type": error_type})
    return orjson.dumps({"error": message, "error_type": error_type})


def error_response(
    path: str, message: str, error_type: str, status: int, headers: dict[str, str] | None = None
) -> Response:
    return Response(
        error_body(path, message, error_type, status),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def vectorpress_error_response(path: str, exc: VectorpressError) -> Response:
    headers = {"Retry-After": "1"} if exc.http_status == 429 else None
    body = exc.to_openai() if path in OPENAI_PATHS else exc.to_json()
    return Response(
        orjson.dumps(body),
        status_code=exc.http_status,
        media_type="application/json",
        headers=headers,
    )


def internal_error_response(path: str) -> Response:
    """A bug's answer: never plain text, never a traceback (the log has the details)."""
    return error_response(path, "internal error", "Backend", 500)


def _validation_message(exc: RequestValidationError) -> tuple[int, str]:
    errors = exc.errors()
    for err in errors:
        if err.get("type") == "json_invalid":
            ctx = err.get("ctx") or {}
            detail = ctx.get("error", err.get("msg", "invalid JSON"))
            return 400, f"Failed to parse the request body as JSON: {detail}"
    parts = []
    for err in errors[:3]:
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid value')}")
    return 422, "Failed to deserialize the JSON body into the target type: " + "; ".join(parts)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(VectorpressError)
    async def _vectorpress(request: Request, exc: VectorpressError) -> Response:
        return vectorpress_error_response(request.url.path, exc)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error on %s", request.url.path)
        return internal_error_response(request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        status, message = _validation_message(exc)
        return error_response(request.url.path, message, "Validation", status)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        # TEI's error types have no names for these; clients that switch on error_type
        # treat them as a bad request, which they are.
        error_type = {401: "Unauthorized", 404: "NotFound", 405: "MethodNotAllowed"}.get(
            exc.status_code, "Validation"
        )
        return error_response(
            request.url.path,
            str(exc.detail),
            error_type,
            exc.status_code,
            dict(exc.headers) if exc.headers else None,
        )
