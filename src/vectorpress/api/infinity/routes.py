"""Infinity's /rerank and /classify answers (reached through api/clash.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi import Request
from starlette.responses import Response

from vectorpress.api import adapters
from vectorpress.api.headers import timing_headers
from vectorpress.api.infinity.schemas import InfinityClassifyRequest, InfinityRerankRequest
from vectorpress.api.native.common import json_response, priority_header
from vectorpress.api.native.schemas import lane_name
from vectorpress.api.routing import infer_for
from vectorpress.core.infer import Result


def _envelope(request: Request, model: str | None, obj: str, result: Result[Any]) -> dict[str, Any]:
    return {
        "object": obj,
        "model": adapters.served_name(request, model),
        "usage": {"prompt_tokens": result.tokens, "total_tokens": result.tokens},
        "id": adapters.new_id("infinity-"),
        "created": adapters.now(),
    }


async def rerank(body: InfinityRerankRequest, request: Request) -> Response:
    infer = infer_for(request, body.model)
    ranked, result = await adapters.rerank(
        infer,
        body.query,
        body.documents,
        top_n=body.top_n,
        raw_scores=body.raw_scores,
        priority=lane_name(body.priority, priority_header(request)),
    )
    results = [
        {
            "relevance_score": np.float32(s),
            "index": i,
            "document": body.documents[i] if body.return_documents else None,
        }
        for i, s in ranked
    ]
    return json_response(
        {**_envelope(request, body.model, "rerank", result), "results": results},
        timing_headers(result),
    )


async def classify(body: InfinityClassifyRequest, request: Request) -> Response:
    infer = infer_for(request, body.model)
    result = await infer.predict(body.input, raw_scores=body.raw_scores, batch=True)
    data = [[{"score": np.float32(s), "label": label} for label, s in one] for one in result.values]
    return json_response(
        {**_envelope(request, body.model, "classify", result), "data": data}, timing_headers(result)
    )
