"""Routes whose body depends on the served model: POST /, /invocations and /vertex."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel
from starlette.responses import Response

from vectorpress.api.headers import timing_headers
from vectorpress.api.native.classify import run_predict, run_rerank
from vectorpress.api.native.common import (
    json_answer,
    priority_header,
    read_json,
    validate,
    validate_instance,
)
from vectorpress.api.native.embed import (
    run_embed,
    run_embed_sparse,
    run_similarity,
)
from vectorpress.api.native.schemas import (
    EmbedRequest,
    EmbedSparseRequest,
    PredictRequest,
    RerankRequest,
    SimilarityRequest,
    VertexRequest,
)
from vectorpress.api.routing import model_for
from vectorpress.api.state import ModelState
from vectorpress.core.infer import Result
from vectorpress.errors import BatchSizeError

router = APIRouter(tags=["Text Embeddings Inference"])

Handler = Callable[[ModelState, Any, str | None], Awaitable[tuple[Any, Result[Any]]]]


def default_route(state: ModelState) -> tuple[type[BaseModel], Handler]:
    """What POST / means for the served model, as TEI decides it."""
    spec = state.infer.spec
    if spec.kind == "classifier":
        return PredictRequest, run_predict
    if spec.kind == "reranker":
        return RerankRequest, run_rerank
    if state.settings.task == "sentence-similarity":
        return SimilarityRequest, run_similarity
    if spec.is_splade:
        return EmbedSparseRequest, run_embed_sparse
    return EmbedRequest, run_embed


def body_model(data: Any) -> str | None:
    """The `model` of a body read before its type is known (a wrong type is left for the
    body's validation to report)."""
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) else None


async def _default(request: Request) -> Response:
    data = await read_json(request)
    state = model_for(request, body_model(data))
    model, handler = default_route(state)
    body = validate(model, data)
    payload, result = await handler(state, body, priority_header(request))
    return await json_answer(payload, timing_headers(result))


_DEFAULT_DOC = (
    "The served model's own route: /predict for classifiers, /rerank for rerankers, "
    "/similarity when TASK=sentence-similarity, /embed_sparse for SPLADE, else /embed"
)
router.add_api_route("/", _default, methods=["POST"], summary=_DEFAULT_DOC)
router.add_api_route("/invocations", _default, methods=["POST"], summary=_DEFAULT_DOC)


async def _instance(state: ModelState, data: dict[str, Any], priority: str | None) -> Any:
    # Like TEI, an instance with a query and texts is a rerank request whatever the model.
    if "query" in data and "texts" in data:
        payload, _ = await run_rerank(state, validate_instance(RerankRequest, data), priority)
        return payload
    model, handler = default_route(state)
    if state.infer.spec.kind != "embedding":
        model, handler = PredictRequest, run_predict
    elif model is SimilarityRequest:
        model, handler = EmbedRequest, run_embed
    payload, _ = await handler(state, validate_instance(model, data), priority)
    return payload


@router.post(
    "/vertex",
    summary="Vertex AI prediction: each of `instances` is a request to the model's own route",
)
async def vertex(body: VertexRequest, request: Request) -> Response:
    state = model_for(request, body.model)
    limit = state.settings.max_client_batch_size
    if len(body.instances) > limit:
        raise BatchSizeError(
            f"batch size {len(body.instances)} > maximum allowed batch size {limit}"
        )
    predictions = await asyncio.gather(
        *(_instance(state, i, priority_header(request)) for i in body.instances),
        return_exceptions=True,
    )
    for p in predictions:
        if isinstance(p, BaseException):
            raise p  # the first failing instance in request order, as TEI
    return await json_answer({"predictions": predictions})
