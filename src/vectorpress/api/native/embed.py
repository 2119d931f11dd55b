"""/embed, /embed_all, /embed_sparse, /embed_multi and /similarity."""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import Response

from vectorpress.api import encodings
from vectorpress.api.headers import timing_headers
from vectorpress.api.native.common import json_answer, priority_header
from vectorpress.api.native.schemas import (
    EmbedAllRequest,
    EmbedMultiRequest,
    EmbedRequest,
    EmbedSparseRequest,
    SimilarityRequest,
    as_batch,
    to_truncation,
)
from vectorpress.api.routing import model_for
from vectorpress.api.state import ModelState
from vectorpress.core.calibration import Calibration
from vectorpress.core.infer import Result
from vectorpress.errors import ValidationError
from vectorpress.types import MultiOutput

router = APIRouter(tags=["Text Embeddings Inference"])


async def run_embed(
    state: ModelState, body: EmbedRequest, priority: str | None = None
) -> tuple[Any, Result[Any]]:
    inputs, is_batch = as_batch(body.inputs)
    result = await state.infer.embed(
        inputs,
        batch=is_batch,
        truncate=body.truncate,
        direction=to_truncation(body.truncation_direction),
        prompt_name=body.prompt_name,
        normalize=body.normalize,
        dimensions=body.dimensions,
        windowed=body.windowed,
        window_overlap=body.window_overlap,
        priority=body.lane(priority),
    )
    return result.values, result


async def run_embed_all(
    state: ModelState, body: EmbedAllRequest, priority: str | None = None
) -> tuple[Any, Result[Any]]:
    inputs, is_batch = as_batch(body.inputs)
    result = await state.infer.embed_all(
        inputs,
        batch=is_batch,
        truncate=body.truncate,
        direction=to_truncation(body.truncation_direction),
        prompt_name=body.prompt_name,
        priority=body.lane(priority),
    )
    return result.values, result


async def run_embed_sparse(
    state: ModelState, body: EmbedSparseRequest, priority: str | None = None
) -> tuple[Any, Result[Any]]:
    inputs, is_batch = as_batch(body.inputs)
    result = await state.infer.embed_sparse(
        inputs,
        batch=is_batch,
        truncate=body.truncate,
        direction=to_truncation(body.truncation_direction),
        prompt_name=body.prompt_name,
        priority=body.lane(priority),
    )
    return [_sparse(idx, val) for idx, val in result.values], result


def _sparse(ids: np.ndarray, weights: np.ndarray) -> list[dict[str, Any]]:
    """A sparse vector as TEI writes one. Values stay float32 scalars: they serialize with
    float32's shortest digits, as TEI's f32 values do (a Python float would print the widened
    double's 17)."""
    return [{"index": i, "value": v} for i, v in zip(ids.tolist(), weights, strict=True)]


def _vectors(array: np.ndarray, body: EmbedMultiRequest, calibration: Calibration | None) -> Any:
    """One output (a dense vector, or a text's per-token matrix) in the body's encoding, by the
    shared encoder every dialect uses."""
    converted = encodings.convert(
        array.astype(np.float32, copy=False), body.dtype, calibration, normalize=body.normalize
    )
    if body.encoding_format == "base64":
        return {
            "base64": encodings.matrix_base64(converted, body.dtype),
            "shape": list(converted.shape),
            "dtype": body.dtype,
        }
    return encodings.to_json(converted, body.dtype)


def multi_payload(
    out: MultiOutput, body: EmbedMultiRequest, calibration: Calibration | None = None
) -> dict[str, Any]:
    item: dict[str, Any] = {}
    if out.dense is not None:
        item["dense"] = _vectors(out.dense, body, calibration)
    if out.sparse is not None:
        item["sparse"] = _sparse(*out.sparse)
    if out.colbert is not None:
        item["colbert"] = _vectors(out.colbert, body, None)
    return item


def check_multi_dtype(body: EmbedMultiRequest) -> None:
    """int8/uint8 levels come from ranges calibrated on pooled vectors: a dense output has
    them, per-token vectors do not (their spread differs), so those are refused up front."""
    if body.colbert and body.dtype in encodings.QUANTIZED:
        raise ValidationError(
            f"Input validation error: `{body.dtype}` is not available for per-token (ColBERT) "
            "vectors; use float32, float16, bfloat16, binary or ubinary"
        )


async def run_embed_multi(
    state: ModelState, body: EmbedMultiRequest, priority: str | None = None
) -> tuple[Any, Result[Any]]:
    inputs, is_batch = as_batch(body.inputs)
    if state.infer.spec.has_multi_vector:
        check_multi_dtype(body)
    result = await state.infer.embed_multi(
        inputs,
        batch=is_batch,
        dense=body.dense,
        sparse=body.sparse,
        colbert=body.colbert,
        normalize=body.normalize,
        is_query=body.is_query,
        truncate=body.truncate,
        direction=to_truncation(body.truncation_direction),
        prompt_name=body.prompt_name,
        windowed=body.windowed,
        priority=body.lane(priority),
    )
    calibration = state.infer.calibration
    return [multi_payload(v, body, calibration) for v in result.values], result


async def run_similarity(
    state: ModelState, body: SimilarityRequest, priority: str | None = None
) -> tuple[Any, Result[Any]]:
    params = body.parameters
    result = await state.infer.similarity(
        body.inputs.source_sentence,
        body.inputs.sentences,
        truncate=params.truncate if params else None,
        direction=to_truncation(params.truncation_direction if params else "Right"),
        prompt_name=params.prompt_name if params else None,
        priority=body.lane(priority),
    )
    return [np.float32(v) for v in result.values], result


@router.post("/embed", summary="Pooled embeddings, one vector per input (normalized by default)")
async def embed(body: EmbedRequest, request: Request) -> Response:
    payload, result = await run_embed(
        model_for(request, body.model), body, priority_header(request)
    )
    return await json_answer(payload, timing_headers(result))


@router.post("/embed_all", summary="The last hidden state of every token of every input")
async def embed_all(body: EmbedAllRequest, request: Request) -> Response:
    payload, result = await run_embed_all(
        model_for(request, body.model), body, priority_header(request)
    )
    return await json_answer(payload, timing_headers(result))


@router.post("/embed_sparse", summary="SPLADE sparse embeddings: the non-zero (index, value)s")
async def embed_sparse(body: EmbedSparseRequest, request: Request) -> Response:
    payload, result = await run_embed_sparse(
        model_for(request, body.model), body, priority_header(request)
    )
    return await json_answer(payload, timing_headers(result))


@router.post(
    "/embed_multi",
    summary="Multi-vector embeddings: per-token (ColBERT) vectors, and for bge-m3 any of its "
    "dense, sparse and ColBERT outputs from one forward pass",
)
async def embed_multi(body: EmbedMultiRequest, request: Request) -> Response:
    payload, result = await run_embed_multi(
        model_for(request, body.model), body, priority_header(request)
    )
    return await json_answer(payload, timing_headers(result))


@router.post("/similarity", summary="Cosine similarity of each sentence with a source sentence")
async def similarity(body: SimilarityRequest, request: Request) -> Response:
    payload, result = await run_similarity(
        model_for(request, body.model), body, priority_header(request)
    )
    return await json_answer(payload, timing_headers(result))
