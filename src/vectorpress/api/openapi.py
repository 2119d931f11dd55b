"""The served OpenAPI document, made exact, and the Swagger UI that shows it, served offline.

FastAPI documents only 200 and its own 422 shape; vectorpress answers TEI's error JSON with
TEI's statuses, and clients generated from the document (and the fuzzing tests) need those.

FastAPI's own `/docs` loads Swagger UI from a CDN, a blank page in an air-gapped deployment; the
UI's files come from the `swagger-ui-bundle-v2` package instead and are served under
`/docs/assets/`.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.openapi.utils import get_openapi
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

from vectorpress.api import clash
from vectorpress.api.errors import dialect_of

DOCS = "/docs"
DOCS_OAUTH2_REDIRECT = "/docs/oauth2-redirect"
#: Swagger UI's own files (script, style, icons); public like the page that loads them.
DOCS_ASSETS = "/docs/assets"

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
    "CohereErrorResponse": {
        "type": "object",
        "required": ["id", "message"],
        "properties": {"id": {"type": "string"}, "message": {"type": "string"}},
    },
    "NestedErrorResponse": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": "null"},
                    "code": {"type": "integer"},
                },
            }
        },
    },
    "CohereJinaErrorResponse": {
        "type": "object",
        "required": ["id", "message", "detail"],
        "properties": {
            "id": {"type": "string"},
            "message": {"type": "string"},
            "detail": {"type": "string"},
        },
    },
    "CohereNestedErrorResponse": {
        "allOf": [
            {"$ref": "#/components/schemas/CohereErrorResponse"},
            {"$ref": "#/components/schemas/NestedErrorResponse"},
        ]
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

_INT = {"type": "integer"}
_STR = {"type": "string"}


def _object(required: dict[str, Any], optional: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "required": list(required),
        "properties": {**required, **(optional or {})},
    }


_USAGE = _object({"prompt_tokens": _INT, "total_tokens": _INT}, {"completion_tokens": _INT})
_META = _object({"api_version": _object({"version": _STR}), "billed_units": {"type": "object"}})
_DOCUMENT = {"type": "object", "required": ["text"], "properties": {"text": _STR}}
_RERANK = _object(
    {
        "id": _STR,
        "model": _STR,
        "results": _array(
            _object({"index": _INT, "relevance_score": _NUMBER}, {"document": {"type": "object"}})
        ),
        "usage": _USAGE,
        "meta": _META,
    }
)
_MATRIX_OF = {
    "float": _array(_array(_NUMBER)),
    "int8": _array(_array(_INT)),
    "uint8": _array(_array(_INT)),
    "binary": _array(_array(_INT)),
    "ubinary": _array(_array(_INT)),
    "base64": _array(_STR),
}
_EMBED = _object(
    {
        "id": _STR,
        "response_type": {"type": "string", "enum": ["embeddings_floats", "embeddings_by_type"]},
        "embeddings": {
            "anyOf": [
                _array(_array(_NUMBER)),
                {"type": "object", "properties": _MATRIX_OF, "additionalProperties": False},
            ]
        },
        "texts": _array(_STR),
        "meta": _META,
    }
)
_VLLM_SCORE = _object(
    {
        "id": _STR,
        "object": _STR,
        "created": _INT,
        "model": _STR,
        "data": _array(_object({"index": _INT, "object": _STR, "score": _NUMBER})),
        "usage": _USAGE,
    }
)
_VLLM_CLASSIFY = _object(
    {
        "id": _STR,
        "object": _STR,
        "created": _INT,
        "model": _STR,
        "data": _array(
            _object({"index": _INT, "label": _STR, "probs": _array(_NUMBER), "num_classes": _INT})
        ),
        "usage": _USAGE,
    }
)
_INFINITY_ENVELOPE = {"model": _STR, "usage": _USAGE, "id": _STR, "created": _INT}
_INFINITY_RERANK = _object(
    {
        "object": {"type": "string", "enum": ["rerank"]},
        "results": _array(
            _object(
                {
                    "relevance_score": _NUMBER,
                    "index": _INT,
                    "document": {"anyOf": [_STR, {"type": "null"}]},
                }
            )
        ),
        **_INFINITY_ENVELOPE,
    }
)
_INFINITY_CLASSIFY = _object(
    {
        "object": {"type": "string", "enum": ["classify"]},
        "data": _array(_array(_ref("Prediction"))),
        **_INFINITY_ENVELOPE,
    }
)
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
                        "enum": [
                            "embedding",
                            "sparse_embedding",
                            "multi_vector_embedding",
                            "reranker",
                            "classifier",
                        ],
                    },
                    "family": {
                        "anyOf": [
                            {"type": "string", "enum": ["bge-m3", "colbert", "llm-reranker"]},
                            {"type": "null"},
                        ]
                    },
                    "outputs": _array(
                        {"type": "string", "enum": ["dense", "sparse", "colbert", "scores"]}
                    ),
                    "capabilities": _array({"type": "string"}),
                    "windowed_inputs": {"type": "boolean"},
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
    "/embed_multi": _array(
        {
            "type": "object",
            "description": "The outputs asked for; `dense` and `colbert` as JSON numbers, or "
            "with encoding_format base64 as {base64, shape, dtype}",
            "properties": {
                "dense": {"anyOf": [_array(_NUMBER), {"type": "object"}]},
                "sparse": _array(_ref("SparseValue")),
                "colbert": {"anyOf": [_array(_array(_NUMBER)), {"type": "object"}]},
            },
        }
    ),
    "/similarity": _array(_NUMBER),
    "/predict": {"anyOf": [_array(_ref("Prediction")), _array(_array(_ref("Prediction")))]},
    "/rerank": {"anyOf": [_array(_ref("Rank")), _INFINITY_RERANK]},
    "/tokenize": _array(_array(_ref("SimpleToken"))),
    "/decode": _array({"type": "string"}),
    "/v1/embeddings": _OPENAI_EMBEDDINGS,
    "/embeddings": _OPENAI_EMBEDDINGS,
    "/v2/rerank": _RERANK,
    "/v1/rerank": _RERANK,
    "/v2/embed": _EMBED,
    "/v1/embed": _EMBED,
    "/score": _VLLM_SCORE,
    "/v1/score": _VLLM_SCORE,
    "/v1/classify": _VLLM_CLASSIFY,
    "/classify": {"anyOf": [_VLLM_CLASSIFY, _INFINITY_CLASSIFY]},
    "/detokenize": _object({"prompt": _STR}),
    "/v1/models": _MODEL_LIST,
    "/models": _MODEL_LIST,
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


#: The error body schema of each dialect (api/errors.py SHAPES).
_ERROR_SCHEMAS = {
    "tei": "ErrorResponse",
    "openai": "OpenAIErrorResponse",
    "cohere": "CohereErrorResponse",
    "vllm": "NestedErrorResponse",
    "infinity": "NestedErrorResponse",
    "cohere+jina": "CohereJinaErrorResponse",
    "cohere+vllm": "CohereNestedErrorResponse",
}


def _error_schema(path: str) -> dict[str, Any]:
    names = {_ERROR_SCHEMAS[dialect_of(path)]}
    if path in clash.BODIES:  # the body decides, so either dialect's shape can come back
        names.add("NestedErrorResponse")
    refs = [_ref(name) for name in sorted(names)]
    return refs[0] if len(refs) == 1 else {"anyOf": refs}


def _error_response(description: str, path: str) -> dict[str, Any]:
    schema = _error_schema(path)
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _add_bodies(components: dict[str, Any]) -> None:
    """The request bodies of the shared paths, which their routes read by hand."""
    for models in clash.BODIES.values():
        for model in models:
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(schema.pop("$defs", {}))
            components[model.__name__] = schema


def document(app: FastAPI, protected: bool) -> dict[str, Any]:
    """Build the document once, with error responses and 200 bodies filled in."""
    if app.openapi_schema:
        return app.openapi_schema
    spec = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
    components = spec.setdefault("components", {}).setdefault("schemas", {})
    components.update(_SCHEMAS)
    _add_bodies(components)
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    for path, operations in spec.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            if path in _OK:
                responses["200"] = {
                    "description": "Success",
                    "content": {"application/json": {"schema": _OK[path]}},
                }
            if method == "post":
                for status, description in _POST_ERRORS.items():
                    responses[status] = _error_response(description, path)
            if path == "/info":
                responses["404"] = _error_response("No served model has that name", path)
            if path == "/health":
                responses["200"] = {"description": "The backend answers"}
                responses["503"] = _error_response("The backend is not answering", path)
            if protected and path not in ("/health", "/metrics"):
                responses["401"] = _error_response("Missing or wrong API key", path)
    app.openapi_schema = spec
    return spec


def install(app: FastAPI, protected: bool) -> None:
    """Serve the document at the app's openapi_url and Swagger UI at /docs (docs_url=None)."""
    from swagger_ui_bundle import swagger_ui_path

    app.openapi = lambda: document(app, protected)  # type: ignore[method-assign]
    app.mount(DOCS_ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")
    openapi_url = app.openapi_url or "/api-doc/openapi.json"

    @app.get(DOCS, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_ASSETS}/favicon-32x32.png",
            oauth2_redirect_url=f"{root}{DOCS_OAUTH2_REDIRECT}",
        )

    @app.get(DOCS_OAUTH2_REDIRECT, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()
