"""What every dialect's handlers share: JSON responses and parsing a body by model kind."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
import pydantic
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from starlette.responses import Response

from vectorpress.api import answers
from vectorpress.errors import ValidationError

B = TypeVar("B", bound=pydantic.BaseModel)


def json_response(
    payload: object, headers: dict[str, str] | None = None, status_code: int = 200
) -> Response:
    return Response(
        orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status_code,
        media_type="application/json",
        headers=headers,
    )


async def json_answer(payload: object, headers: dict[str, str] | None = None) -> Response:
    """An inference answer: as json_response, its body built off the loop when it is large."""
    return Response(
        await answers.json_body(payload), media_type="application/json", headers=headers
    )


async def read_json(request: Request) -> Any:
    """The body as JSON, for routes whose body type depends on the served model."""
    raw = await request.body()
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        # Same answer the framework gives on typed routes (see api/errors.py).
        raise RequestValidationError(
            [
                {
                    "type": "json_invalid",
                    "loc": ("body",),
                    "msg": str(exc),
                    "ctx": {"error": str(exc)},
                }
            ]
        ) from None


def validate(model: type[B], data: Any) -> B:
    """`data` as `model`, failing with the same 422 a typed route gives."""
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False)) from None


def validate_instance(model: type[B], data: Any) -> B:
    """As `validate`, for one Vertex instance: TEI answers 422 Validation with the message."""
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        parts = []
        for err in exc.errors(include_url=False)[:3]:
            loc = ".".join(str(x) for x in err.get("loc", ()))
            parts.append(f"{loc or 'instance'}: {err.get('msg', 'invalid value')}")
        raise ValidationError("Failed to parse instance: " + "; ".join(parts)) from None


def priority_header(request: Request) -> str | None:
    """The request's `x-priority` header (a body's `priority` field overrides it)."""
    return request.headers.get("x-priority")
