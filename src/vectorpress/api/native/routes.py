"""TEI's embedding, health and info routes."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from vectorpress.api.headers import timing_headers
from vectorpress.api.native.schemas import EmbedRequest, as_batch, to_truncation
from vectorpress.api.state import get_state
from vectorpress.errors import UnhealthyError

router = APIRouter()
health_router = APIRouter()


def json_response(
    payload: object, headers: dict[str, str] | None = None, status_code: int = 200
) -> Response:
    return Response(
        orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status_code,
        media_type="application/json",
        headers=headers,
    )


@router.post(
    "/embed", tags=["Text Embeddings Inference"], summary="Get embeddings (normalized by default)"
)
async def embed(body: EmbedRequest, request: Request) -> Response:
    state = get_state(request)
    inputs, _ = as_batch(body.inputs)
    result = await state.infer.embed(
        inputs,
        truncate=body.truncate,
        direction=to_truncation(body.truncation_direction),
        prompt_name=body.prompt_name,
        normalize=body.normalize,
        dimensions=body.dimensions,
    )
    return json_response(result.values, timing_headers(result))


@router.get("/info", tags=["Text Embeddings Inference"], summary="Model and server info")
async def info(request: Request) -> Response:
    return json_response(get_state(request).info())


async def _health(request: Request) -> Response:
    if await get_state(request).infer.health():
        return Response(status_code=200)
    err = UnhealthyError()
    return json_response(err.to_json(), status_code=err.http_status)


health_router.add_api_route(
    "/health",
    _health,
    methods=["GET"],
    tags=["Text Embeddings Inference"],
    summary="Health check: 200 when the backend answers",
)
health_router.add_api_route("/", _health, methods=["GET"], include_in_schema=False)
health_router.add_api_route("/ping", _health, methods=["GET"], include_in_schema=False)
