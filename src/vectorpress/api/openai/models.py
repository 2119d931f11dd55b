"""GET /v1/models: OpenAI's list of the served models, with what each can do; also GET /models
(Infinity's listing path)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from vectorpress.api.native.common import json_response
from vectorpress.api.state import AppState, ModelState, get_state
from vectorpress.model_spec import ModelSpec

router = APIRouter(tags=["OpenAI"])


_CAPABILITIES = {
    "embedding": ["embed"],
    "reranker": ["rerank", "classify"],
    "classifier": ["classify"],
}
#: The kinds TEI lacks, by ModelSpec.family: what each serves (the other routes answer 424).
_FAMILY_CAPABILITIES = {
    "bge-m3": ["embed", "embed_sparse", "embed_multi", "rerank", "score"],
    "colbert": ["embed_multi", "rerank", "score"],
    # Pairs only: /predict on (query, document) pairs, /rerank and the score routes.
    "llm-reranker": ["rerank", "score"],
}


def kind(spec: ModelSpec) -> str:
    """What the listing calls a model: a ColBERT model has no pooled vector to embed with."""
    if spec.colbert is not None:
        return "multi_vector_embedding"
    return "sparse_embedding" if spec.is_splade else spec.kind


def capabilities(spec: ModelSpec) -> list[str]:
    if spec.family is not None:
        return list(_FAMILY_CAPABILITIES[spec.family])
    return list(_CAPABILITIES.get(spec.kind, []))


def model_object(state: AppState, model: ModelState) -> dict[str, Any]:
    spec = model.infer.spec
    return {
        "id": model.name,
        "object": "model",
        "created": state.created,
        "owned_by": "vectorpress",
        # Beyond OpenAI's four fields: what a client needs to pick a model and size its input.
        "kind": kind(spec),
        "family": spec.family,
        "outputs": list(spec.outputs),
        "max_input_length": spec.max_input_length,
        "aliases": list(model.settings.aliases),
        "default": model is state.default,
        # What vLLM's and Infinity's listings add, so their clients read this one too.
        "root": model.settings.model_id,
        "parent": None,
        "max_model_len": spec.max_input_length,
        "permission": [],
        "backend": model.backend_name,
        "capabilities": capabilities(spec),
        "windowed_inputs": model.settings.windowed_inputs and spec.windows,
        "stats": {
            "queue_fraction": 0.0,
            "queue_absolute": len(model.infer.queue),
            "results_pending": 0,
        },
    }


@router.get("/v1/models", summary="The served models (OpenAI's list), the default one first")
async def list_models(request: Request) -> Response:
    state = get_state(request)
    return json_response({"object": "list", "data": [model_object(state, m) for m in state.models]})


router.add_api_route(
    "/models", list_models, methods=["GET"], summary="Alias of /v1/models (Infinity's listing)"
)
