"""/predict and /rerank (the latter routed by api/clash.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import Response

from vectorpress.api.headers import timing_headers
from vectorpress.api.native.common import json_answer, priority_header
from vectorpress.api.native.schemas import (
    PredictRequest,
    RerankRequest,
    predict_batch,
    to_truncation,
)
from vectorpress.api.routing import model_for
from vectorpress.api.state import ModelState
from vectorpress.core.infer import Result

router = APIRouter(tags=["Text Embeddings Inference"])


async def run_predict(
    state: ModelState, body: PredictRequest, priority: str | None = None
) -> tuple[Any, Result[Any]]:
    inputs, is_batch = predict_batch(body.inputs)
    result = await state.infer.predict(
        inputs,
        batch=is_batch,
        truncate=body.truncate,
        direction=to_truncation(body.truncation_direction),
        raw_scores=body.raw_scores,
        priority=body.lane(priority),
    )
    # float32 scalars serialize with float32's shortest digits, as TEI's f32 scores do.
    payload = [
        [{"score": np.float32(s), "label": label} for label, s in one] for one in result.values
    ]
    return (payload if is_batch else payload[0]), result


async def run_rerank(
    state: ModelState, body: RerankRequest, priority: str | None = None
) -> tuple[Any, Result[Any]]:
    result = await state.infer.rerank(
        body.query,
        body.texts,
        truncate=body.truncate,
        direction=to_truncation(body.truncation_direction),
        raw_scores=body.raw_scores,
        weights=body.weights,
        windowed=body.windowed,
        window_overlap=body.window_overlap,
        priority=body.lane(priority),
    )
    if body.return_text:
        payload = [
            {"index": i, "text": body.texts[i], "score": np.float32(s)} for i, s in result.values
        ]
    else:
        payload = [{"index": i, "score": np.float32(s)} for i, s in result.values]
    return payload, result


@router.post(
    "/predict",
    summary="Classify texts or pairs; scores per label, best first "
    "(sigmoid for one label, softmax otherwise)",
)
async def predict(body: PredictRequest, request: Request) -> Response:
    payload, result = await run_predict(
        model_for(request, body.model), body, priority_header(request)
    )
    return await json_answer(payload, timing_headers(result))


# Served on /rerank through api/clash.py, which shares the path with Infinity's body.
async def rerank(body: RerankRequest, request: Request) -> Response:
    payload, result = await run_rerank(
        model_for(request, body.model), body, priority_header(request)
    )
    return await json_answer(payload, timing_headers(result))
