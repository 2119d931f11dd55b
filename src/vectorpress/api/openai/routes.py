"""POST /v1/embeddings and /embeddings. Errors use OpenAI's shape (see api/errors.py).

Also Infinity's /embeddings, and the extensions of Jina's and vLLM's clients (see schemas.py)."""

from __future__ import annotations

import base64
import logging
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import Response

from vectorpress.api import adapters, encodings
from vectorpress.api.headers import timing_headers
from vectorpress.api.jina.extras import task_prompt
from vectorpress.api.native.common import json_answer, priority_header
from vectorpress.api.native.schemas import as_batch
from vectorpress.api.openai.schemas import EmbeddingsRequest
from vectorpress.api.routing import model_for
from vectorpress.api.state import ModelState
from vectorpress.core.infer import Result
from vectorpress.errors import ValidationError

log = logging.getLogger(__name__)

router = APIRouter(tags=["OpenAI"])


def _b64(vector: np.ndarray) -> str:
    """Standard base64 of the little-endian float32 bytes, what OpenAI's clients decode."""
    return base64.b64encode(vector.astype("<f4", copy=False).tobytes()).decode("ascii")


def _wire(body: EmbeddingsRequest) -> tuple[str, bool]:
    """The value type and whether it goes out as base64: Jina's `embedding_type` first, then
    `encoding_format` with vLLM's `embed_dtype`."""
    if body.embedding_type is not None:
        kind = body.embedding_type
        return ("float32", kind == "base64") if kind in ("float", "base64") else (kind, False)
    fmt = body.encoding_format
    if fmt in ("float", "base64"):
        return body.embed_dtype or "float32", fmt == "base64"
    if body.embed_dtype is not None and body.embed_dtype != fmt:
        raise ValidationError(
            f"Input validation error: `encoding_format` {fmt} and `embed_dtype` "
            f"{body.embed_dtype} disagree"
        )
    return fmt, False


async def _truncated_inputs(
    state: ModelState, inputs: list[str | list[int]], limit: int
) -> list[str | list[int]]:
    """vLLM's `truncate_prompt_tokens`: the first `limit` tokens, special tokens counted."""
    if limit <= 0:
        raise ValidationError(
            "Input validation error: `truncate_prompt_tokens` must be -1 or a positive integer"
        )
    specials = sum((await state.infer.tokenize(["a"]))[0].special)
    if limit <= specials:
        raise ValidationError(
            f"Input validation error: `truncate_prompt_tokens` must be above {specials}, the "
            "model's special tokens"
        )
    texts = [i for i in inputs if isinstance(i, str)]
    cut = iter(await adapters.cut_to_tokens(state.infer, texts, limit - specials))
    return [next(cut) if isinstance(i, str) else i[:limit] for i in inputs]


async def run_embeddings(
    state: ModelState, body: EmbeddingsRequest, priority: str | None = None
) -> tuple[Any, Result[Any]]:
    name = state.name
    if body.model is not None and body.model not in state.names:
        log.warning("request asks for model %r; serving %r", body.model, name)
    inputs, is_batch = as_batch(body.input)
    dtype, as_base64 = _wire(body)
    # OpenAI's API has no per-request truncation: --auto-truncate decides unless vLLM's
    # `truncate_prompt_tokens` is given (TEI ignores a `truncate` field here, and so do we).
    truncate: bool | None = None
    if body.truncate_prompt_tokens == -1:
        truncate = True
    elif body.truncate_prompt_tokens is not None:
        inputs = await _truncated_inputs(state, inputs, body.truncate_prompt_tokens)
    normalize = body.normalized is not False
    result = await state.infer.embed(
        inputs,
        truncate=truncate,
        prompt_name=task_prompt(state.infer, body.task),
        normalize=normalize,
        dimensions=body.dimensions,
        batch=is_batch,
        windowed=body.windowed,
        window_overlap=body.window_overlap,
        priority=body.lane(priority),
    )
    embeddings: Any
    if dtype == "float32":
        embeddings = [_b64(v) for v in result.values] if as_base64 else result.values
    else:
        converted = encodings.convert(
            encodings.stack(result.values),
            dtype,
            state.infer.calibration,
            dimensions=body.dimensions,
            normalize=normalize,
        )
        if as_base64:
            embeddings = encodings.to_base64(converted, dtype)
        else:
            embeddings = encodings.to_json(converted, dtype)
    payload = {
        "object": "list",
        "data": [
            {"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(embeddings)
        ],
        "model": name,
        "usage": {"prompt_tokens": result.tokens, "total_tokens": result.tokens},
    }
    return payload, result


async def embeddings(body: EmbeddingsRequest, request: Request) -> Response:
    payload, result = await run_embeddings(
        model_for(request, body.model), body, priority_header(request)
    )
    return await json_answer(payload, timing_headers(result))


router.add_api_route(
    "/v1/embeddings",
    embeddings,
    methods=["POST"],
    summary="OpenAI-compatible embeddings (float or base64), with Jina's and vLLM's extensions",
)
router.add_api_route("/embeddings", embeddings, methods=["POST"], summary="Alias of /v1/embeddings")
