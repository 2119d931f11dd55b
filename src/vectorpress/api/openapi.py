"""The served OpenAPI document, made exact: every status a route can answer, with its body.

FastAPI documents only 200 and its own 422 shape; vectorpress answers TEI's error JSON with
TEI's statuses, and clients generated from the document (and the fuzzing tests) need those.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

_ERROR_TYPES = [
    "Empty",
    "Validation",
    "Tokenizer",
    "Backend",
    "Overloaded",
    "Unhealthy",
    "Unauthorized",
    "NotFound",
]

_SCHEMAS: dict[str, Any] = {
    "ErrorResponse": {
        "type": "object",
        "required": ["error", "error_type"],
        "properties": {
            "error": {"type": "string"},
            "error_type": {"type": "string", "enum": _ERROR_TYPES},
            "models": {
                "type": "array",
                "items": {"type": "string"},
                "description": "With NotFound: the names of the served models",
            },
        },
    },
    "OpenAIErrorResponse": {
        "type": "object",
        "required": ["message", "code", "type"],
        "properties": {
            "message": {"type": "string"},
            # The status, or OpenAI's reason (`model_not_found`) for an unknown model.
            "code": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
            "type": {"type": "string", "enum": [*_ERROR_TYPES, "invalid_request_error"]},
            "param": {"type": "string"},
        },
    },
    "Prediction": {
        "type": "object",
        "required": ["score", "label"],
        "properties": {"score": {"type": "number"}, "label": {"type": "string"}},
    },
    "Rank": {
        "type": "object",
        "required": ["index", "score"],
        "properties": {
            "index": {"type": "integer", "minimum": 0},
            "text": {"type": "string"},
            "score": {"type": "number"},
        },
    },
    "SparseValue": {
        "type": "object",
        "required": ["index", "value"],
        "properties": {"index": {"type": "integer", "minimum": 0}, "value": {"type": "number"}},
    },
    "SimpleToken": {
        "type": "object",
        "required": ["id", "text", "special", "start", "stop"],
        "properties": {
            "id": {"type": "integer", "minimum": 0},
            "text": {"type": "string"},
            "special": {"type": "boolean"},
            "start": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]},
            "stop": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]},
        },
    },
}


def _array(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": item}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


_NUMBER = {"type": "number"}
_OPENAI_EMBEDDINGS = {
    "type": "object",
    "required": ["object", "data", "model", "usage"],
    "properties": {
        "object": {"type": "string", "enum": ["list"]},
        "data": _array(
            {
                "type": "object",
                "required": ["object", "embedding", "index"],
                "properties": {
                    "object": {"type": "string", "enum": ["embedding"]},
                    "embedding": {"anyOf": [_array(_NUMBER), {"type": "string"}]},
                    "index": {"type": "integer", "minimum": 0},
                },
            }
        ),
        "model": {"type": "string"},
        "usage": {
            "type": "object",
            "required": ["prompt_tokens", "total_tokens"],
            "properties": {
                "prompt_tokens": {"type": "integer"},
                "total_tokens": {"type": "integer"},
            },
        },
    },
}

_MODEL_LIST = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {
        "object": {"type": "string", "enum": ["list"]},
        "data": _array(
            {
                "type": "object",
                "required": ["id", "object", "created", "owned_by", "kind", "max_input_length"],
                "properties": {
                    "id": {"type": "string"},
                    "object": {"type": "string", "enum": ["model"]},
                    "created": {"type": "integer"},
                    "owned_by": {"type": "string"},
                    "kind": {
                        "type": "string",
                        "enum": ["embedding", "sparse_embedding", "reranker", "classifier"],
                    },
                    "max_input_length": {"type": "integer"},
                    "aliases": _array({"type": "string"}),
                    "default": {"type": "boolean"},
                },
            }
        ),
    },
}

#: The 200 body of each route.
_OK: dict[str, dict[str, Any]] = {
    "/embed": _array(_array(_NUMBER)),
    "/embed_all": _array(_array(_array(_NUMBER))),
    "/embed_sparse": _array(_array(_ref("SparseValue"))),
    "/similarity": _array(_NUMBER),
    "/predict": {"anyOf": [_array(_ref("Prediction")), _array(_array(_ref("Prediction")))]},
    "/rerank": _array(_ref("Rank")),
    "/tokenize": _array(_array(_ref("SimpleToken"))),
    "/decode": _array({"type": "string"}),
    "/v1/embeddings": _OPENAI_EMBEDDINGS,
    "/embeddings": _OPENAI_EMBEDDINGS,
    "/v1/models": _MODEL_LIST,
    "/vertex": {
        "type": "object",
        "required": ["predictions"],
        "properties": {"predictions": {"type": "array"}},
    },
}

#: Statuses a POST inference route can answer besides 200, with what they mean.
_POST_ERRORS = {
    "400": "Empty input, or a body that is not valid JSON",
    "413": "Body larger than --payload-limit",
    "415": "Body is not JSON",
    "422": "Input that the model cannot take",
    "424": "The model cannot serve this route, or the forward pass failed",
    "429": "No admission permit was free; retry after the Retry-After header",
    "503": "The backend is not answering",
    "404": "No served model has the name the body's `model` gives",
}


def _error_response(description: str, openai: bool) -> dict[str, Any]:
    schema = _ref("OpenAIErrorResponse" if openai else "ErrorResponse")
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def document(app: FastAPI, protected: bool) -> dict[str, Any]:
    """Build the document once, with error responses and 200 bodies filled in."""
    if app.openapi_schema:
        return app.openapi_schema
    spec = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
    components = spec.setdefault("components", {}).setdefault("schemas", {})
    components.update(_SCHEMAS)
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    for path, operations in spec.get("paths", {}).items():
        openai = path in ("/v1/embeddings", "/embeddings")
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            if path in _OK:
                responses["200"] = {
                    "description": "Success",
                    "content": {"application/json": {"schema": _OK[path]}},
                }
            if method == "post":
                for status, description in _POST_ERRORS.items():
                    responses[status] = _error_response(description, openai)
            if path == "/info":
                responses["404"] = _error_response("No served model has that name", False)
            if path == "/health":
                responses["200"] = {"description": "The backend answers"}
                responses["503"] = _error_response("The backend is not answering", False)
            if protected and path not in ("/health", "/metrics"):
                responses["401"] = _error_response("Missing or wrong API key", openai)
    app.openapi_schema = spec
    return spec


def install(app: FastAPI, protected: bool) -> None:
    app.openapi = lambda: document(app, protected)  # type: ignore[method-assign]
