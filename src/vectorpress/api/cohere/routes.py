"""POST /v2/rerank, /v2/embed, /v1/rerank, /v1/embed in Cohere's shapes.

The rerank answers also carry Jina's and vLLM's fields (`model`, `usage`), so the same route
serves the clients of all three: their results are the same objects."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import Response

from vectorpress.api import adapters
from vectorpress.api.cohere.schemas import EmbedBody, RerankBody
from vectorpress.api.headers import timing_headers
from vectorpress.api.native.common import json_response, priority_header
from vectorpress.api.native.schemas import lane_name
from vectorpress.api.routing import infer_for
from vectorpress.errors import EmptyError, ValidationError

router = APIRouter(tags=["Cohere"])

EMBEDDING_TYPES = ("float", "int8", "uint8", "binary", "ubinary", "base64")
#: The prompt names each `input_type` maps to, first match wins.
INPUT_TYPE_PROMPTS = {
    "search_query": ("query", "search_query"),
    "search_document": ("document", "passage", "search_document"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}


def _meta(version: str, **billed: int) -> dict[str, Any]:
    return {"api_version": {"version": version}, "billed_units": billed}


async def rerank(body: RerankBody, request: Request, version: str) -> Response:
    infer = infer_for(request, body.model)
    texts = [adapters.document_text(d, body.rank_fields) for d in body.documents]
    texts = await adapters.cut_to_tokens(infer, texts, body.max_tokens_per_doc)
    ranked, result = await adapters.rerank(
        infer,
        body.query,
        texts,
        top_n=body.top_n,
        raw_scores=body.use_activation is False,
        max_windows=body.max_chunks_per_doc,
        priority=lane_name(body.priority, priority_header(request)),
    )
    results = []
    for i, score in ranked:
        item: dict[str, Any] = {"index": i, "relevance_score": np.float32(score)}
        if body.return_documents:
            item["document"] = adapters.as_document(body.documents[i])
        results.append(item)
    payload = {
        "id": adapters.new_id(),
        "model": adapters.served_name(request, body.model),
        "results": results,
        "usage": {"prompt_tokens": result.tokens, "total_tokens": result.tokens},
        "meta": _meta(version, search_units=math.ceil(len(texts) / 100)),
    }
    return json_response(payload, timing_headers(result))


def _texts(body: EmbedBody) -> list[str]:
    if body.images or body.input_type == "image":
        raise ValidationError("Input validation error: images are not supported; embed texts")
    if body.texts is not None and body.inputs is not None:
        raise ValidationError("Input validation error: give `texts` or `inputs`, not both")
    if body.inputs is not None:
        return [" ".join(part.text for part in one.content) for one in body.inputs]
    if not body.texts:
        raise EmptyError("Input validation error: `texts` cannot be empty")
    return list(body.texts)


def _embedding_types(requested: list[str] | None) -> list[str]:
    kinds = list(dict.fromkeys(["float"] if requested is None else requested))
    if not kinds:
        raise ValidationError("Input validation error: `embedding_types` cannot be empty")
    for kind in kinds:
        if kind not in EMBEDDING_TYPES:
            raise ValidationError(
                f"Input validation error: unknown embedding type `{kind}`; expected any of "
                + ", ".join(EMBEDDING_TYPES)
            )
    return kinds


async def embed(body: EmbedBody, request: Request, version: str) -> Response:
    infer = infer_for(request, body.model)
    texts = _texts(body)
    kinds = _embedding_types(body.embedding_types)
    truncate, direction = adapters.truncation(body.truncate)
    names = INPUT_TYPE_PROMPTS.get(body.input_type or "", ())
    texts = await adapters.cut_to_tokens(infer, texts, body.max_tokens)
    matrix, result = await adapters.embed_matrix(
        infer,
        texts,
        truncate=truncate,
        direction=direction,
        prompt_name=adapters.prompt_for(infer, names),
        dimensions=body.output_dimension,
    )
    payload: dict[str, Any] = {"id": adapters.new_id()}
    if version == "1" and body.embedding_types is None:
        payload["response_type"] = "embeddings_floats"
        payload["embeddings"] = matrix
    else:
        payload["response_type"] = "embeddings_by_type"
        payload["embeddings"] = adapters.typed_embeddings(
            infer, matrix, kinds, dimensions=body.output_dimension, normalize=True
        )
    payload["texts"] = texts
    payload["meta"] = _meta(version, input_tokens=result.tokens)
    return json_response(payload, timing_headers(result))


@router.post("/v2/rerank", summary="Cohere v2 rerank (also vLLM's /v2/rerank)")
async def rerank_v2(body: RerankBody, request: Request) -> Response:
    return await rerank(body, request, "2")


@router.post("/v1/rerank", summary="Cohere v1 rerank, also Jina's and vLLM's /v1/rerank")
async def rerank_v1(body: RerankBody, request: Request) -> Response:
    return await rerank(body, request, "1")


@router.post("/v2/embed", summary="Cohere v2 embed: float, int8, uint8, binary, ubinary, base64")
async def embed_v2(body: EmbedBody, request: Request) -> Response:
    return await embed(body, request, "2")


@router.post("/v1/embed", summary="Cohere v1 embed")
async def embed_v1(body: EmbedBody, request: Request) -> Response:
    return await embed(body, request, "1")
