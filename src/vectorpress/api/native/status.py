"""/info and the health routes."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from starlette.responses import Response

from vectorpress.api.native.common import json_response
from vectorpress.api.routing import model_for, named
from vectorpress.api.state import get_state
from vectorpress.errors import UnhealthyError

router = APIRouter(tags=["Text Embeddings Inference"])
#: Routes open without the API key.
public_router = APIRouter(tags=["Text Embeddings Inference"])


@router.get("/info", summary="Model and server info")
async def info(request: Request) -> Response:
    return json_response(model_for(request).info())


async def _health(request: Request) -> Response:
    if named(request.scope):  # /models/<name>/health or an x-model header: that model alone
        healthy = await model_for(request).infer.health()
    else:  # every model must answer
        models = get_state(request).models
        healthy = all(await asyncio.gather(*(m.infer.health() for m in models)))
    if healthy:
        return Response(status_code=200)
    err = UnhealthyError()
    return json_response(err.to_json(), status_code=err.http_status)


public_router.add_api_route(
    "/health",
    _health,
    methods=["GET"],
    summary="Health check: 200 when every model answers (under /models/<name>/, that one)",
)
public_router.add_api_route("/", _health, methods=["GET"], include_in_schema=False)
public_router.add_api_route("/ping", _health, methods=["GET"], include_in_schema=False)
