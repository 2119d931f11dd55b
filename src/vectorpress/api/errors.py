"""Errors on the HTTP wire: one error table (vectorpress.errors) drawn in each dialect's shape.

The status and type of an error are the same on every route; only the JSON around the message
follows the dialect whose route (or, on a path two dialects share, whose body) it is, so that
each provider's SDK raises its own exception with the message.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import Scope

from vectorpress.api import bodies
from vectorpress.errors import VectorpressError

log = logging.getLogger(__name__)

Shape = Callable[[str, str, int], dict[str, Any]]

#: What FastAPI answers when parsing a body raised something other than a JSON error (a
#: RecursionError, a UnicodeDecodeError).
_FASTAPI_PARSE_FAILURE = "There was an error parsing the body"


def _tei(message: str, error_type: str, status: int) -> dict[str, Any]:
    return {"error": message, "error_type": error_type}


def _openai(message: str, error_type: str, status: int) -> dict[str, Any]:
    return {"message": message, "code": status, "type": error_type}


def _cohere(message: str, error_type: str, status: int) -> dict[str, Any]:
    # Cohere's API answers {"id", "message"}; its SDK picks the exception by status.
    return {"id": str(uuid.uuid4()), "message": message}


def _jina(message: str, error_type: str, status: int) -> dict[str, Any]:
    # Jina's API is FastAPI's {"detail": ...}; its clients raise with `detail`.
    return {"detail": message}


def _nested(message: str, error_type: str, status: int) -> dict[str, Any]:
    # vLLM's and Infinity's OpenAI-style {"error": {message, type, param, code}}.
    return {"error": {"message": message, "type": error_type, "param": None, "code": status}}


def _both(*shapes: Shape) -> Shape:
    """One body that parses as each of `shapes`, for a path two dialects answer alike."""

    def merged(message: str, error_type: str, status: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for shape in shapes:
            out.update(shape(message, error_type, status))
        return out

    return merged


#: Every error shape, by dialect name.
SHAPES: dict[str, Shape] = {
    "tei": _tei,
    "openai": _openai,
    "cohere": _cohere,
    "jina": _jina,
    "vllm": _nested,
    "infinity": _nested,
    "cohere+jina": _both(_cohere, _jina),
    "cohere+vllm": _both(_cohere, _nested),
}

#: The dialect whose error shape a path answers in; every other path is TEI's. A handler on a
#: path whose body decides the dialect sets it on the request (`set_dialect`).
PATH_DIALECTS: dict[str, str] = {
    "/v1/embeddings": "openai",
    "/embeddings": "openai",
    "/v2/embed": "cohere",
    "/v1/embed": "cohere",
    "/v2/rerank": "cohere+vllm",
    "/v1/rerank": "cohere+jina",
    "/score": "vllm",
    "/v1/score": "vllm",
    "/classify": "vllm",
    "/v1/classify": "vllm",
    "/detokenize": "vllm",
    "/v1/models": "openai",
    "/models": "infinity",
}

_SCOPE_KEY = "vectorpress.dialect"


def set_dialect(scope: Scope, dialect: str) -> None:
    """Errors of this request from here on take `dialect`'s shape."""
    scope[_SCOPE_KEY] = dialect


def dialect_of(path: str, scope: Scope | None = None) -> str:
    if scope is not None and _SCOPE_KEY in scope:
        return str(scope[_SCOPE_KEY])
    return PATH_DIALECTS.get(path, "tei")


def error_body(
    path: str, message: str, error_type: str, status: int, scope: Scope | None = None
) -> bytes:
    return orjson.dumps(SHAPES[dialect_of(path, scope)](message, error_type, status))


def error_response(
    path: str,
    message: str,
    error_type: str,
    status: int,
    headers: dict[str, str] | None = None,
    scope: Scope | None = None,
) -> Response:
    return Response(
        error_body(path, message, error_type, status, scope),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def vectorpress_error_response(
    path: str, exc: VectorpressError, scope: Scope | None = None
) -> Response:
    headers = {"Retry-After": "1"} if exc.http_status == 429 else None
    dialect = dialect_of(path, scope)
    # TEI's and OpenAI's bodies come from the error itself (some kinds add fields there).
    if dialect == "tei":
        body = exc.to_json()
    elif dialect == "openai":
        body = exc.to_openai()
    else:
        body = SHAPES[dialect](exc.message, exc.error_type, exc.http_status)
    return Response(
        orjson.dumps(body),
        status_code=exc.http_status,
        media_type="application/json",
        headers=headers,
    )


def internal_error_response(path: str, scope: Scope | None = None) -> Response:
    """A bug's answer: never plain text, never a traceback (the log has the details)."""
    return error_response(path, "internal error", "Backend", 500, scope=scope)


def _parse_failure(request: Request) -> str | None:
    """serde_json's words for a body that did not parse, when the body was read and they apply.

    The request is the one the route read its body from, so the body is at hand.
    """
    raw = getattr(request, "_body", None)
    message = bodies.problem(raw) if isinstance(raw, bytes) else None
    return None if message is None else bodies.PREFIX + message


def _validation_message(exc: RequestValidationError, request: Request) -> tuple[int, str]:
    errors = exc.errors()
    for err in errors:
        if err.get("type") == "json_invalid":
            precise = _parse_failure(request)
            if precise is not None:
                return 400, precise
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
        return vectorpress_error_response(request.url.path, exc, request.scope)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error on %s", request.url.path)
        return internal_error_response(request.url.path, request.scope)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        status, message = _validation_message(exc, request)
        return error_response(request.url.path, message, "Validation", status, scope=request.scope)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        # TEI's error types have no names for these; clients that switch on error_type
        # treat them as a bad request, which they are.
        error_type = {401: "Unauthorized", 404: "NotFound", 405: "MethodNotAllowed"}.get(
            exc.status_code, "Validation"
        )
        detail = str(exc.detail)
        if exc.status_code == 400 and detail == _FASTAPI_PARSE_FAILURE:
            detail = _parse_failure(request) or f"{bodies.PREFIX}invalid JSON"
        return error_response(
            request.url.path,
            detail,
            error_type,
            exc.status_code,
            dict(exc.headers) if exc.headers else None,
            request.scope,
        )
