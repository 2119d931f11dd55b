"""POST /v1/embeddings and /embeddings. Errors use OpenAI's shape (see api/errors.py)."""

from __future__ import annotations

import base64
import logging
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import Response

from vectorpress.api.headers import timing_headers
from vectorpress.api.native.common import json_response, priority_header
from vectorpress.api.native.schemas import as_batch
from vectorpress.api.openai.schemas import EmbeddingsRequest
from vectorpress.api.routing import model_for
from vectorpress.api.state import ModelState
from vectorpress.core.infer import Result

log = logging.getLogger(__name__)

router = APIRouter(tags=["OpenAI"])


def _b64(vector: np.ndarray) -> str:
    """Standard base64 of the little-endian float32 bytes, what OpenAI's clients decode."""
    return base64.b64encode(vector.astype("<f4", copy=False).tobytes()).decode("ascii")


async def run_embeddings(
    state: ModelState, body: EmbeddingsRequest, priority: str | None = None
) -> tuple[Any, Result[Any]]:
    name = state.name
    if body.model is not None and body.model not in state.names:
        log.warning("request asks for model %r; serving %r", body.model, name)
    inputs, is_batch = as_batch(body.input)
    # No per-request truncation here: OpenAI's API has none, so --auto-truncate decides.
    result = await state.infer.embed(
        inputs, dimensions=body.dimensions, batch=is_batch, priority=body.lane(priority)
    )
    encode = _b64 if body.encoding_format == "base64" else (lambda v: v)
    payload = {
        "object": "list",
        "data": [
            {"object": "embedding", "embedding": encode(v), "index": i}
            for i, v in enumerate(result.values)
        ],
        "model": name,
        "usage": {"prompt_tokens": result.tokens, "total_tokens": result.tokens},
    }
    return payload, result


async def embeddings(body: EmbeddingsRequest, request: Request) -> Response:
    payload, result = await run_embeddings(
        model_for(request, body.model), body, priority_header(request)
    )
    return json_response(payload, timing_headers(result))


router.add_api_route(
    "/v1/embeddings",
    embeddings,
    methods=["POST"],
    summary="OpenAI-compatible embeddings (float or base64)",
)
router.add_api_route("/embeddings", embeddings, methods=["POST"], summary="Alias of /v1/embeddings")
