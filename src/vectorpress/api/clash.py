"""Paths that two dialects share, and the rules that pick a request's dialect by its body.

- `/rerank` (TEI, Infinity): a body with `texts`, or without `documents`, is TEI's; one with
  `documents` and no `texts` is Infinity's.
- `/classify` (vLLM, Infinity): a body with `raw_scores` is Infinity's; any other is vLLM's.
- `/v1/rerank` (Cohere v1, Jina, vLLM), `/v2/rerank` (Cohere v2, vLLM): one body type, and one
  answer that holds every one of their shapes.
- `/v1/embeddings`, `/embeddings` (OpenAI as TEI serves it; Jina, vLLM, Infinity): OpenAI's body;
  the others' fields are extensions of it.

TEI's valid `/rerank` bodies never get here: api/direct.py answers them first. A body's errors
take the shape of the dialect its body chose.
"""

from __future__ import annotations

from typing import Any

import pydantic
from fastapi import APIRouter, Request
from starlette.responses import Response

from vectorpress.api.errors import set_dialect
from vectorpress.api.infinity import routes as infinity
from vectorpress.api.infinity.schemas import InfinityClassifyRequest, InfinityRerankRequest
from vectorpress.api.native import classify as tei
from vectorpress.api.native.common import read_json, validate
from vectorpress.api.native.schemas import RerankRequest
from vectorpress.api.vllm import routes as vllm
from vectorpress.api.vllm.schemas import VllmClassifyRequest

router = APIRouter()

#: Request body models of the shared paths, one per dialect, for the OpenAPI document.
BODIES: dict[str, tuple[type[pydantic.BaseModel], ...]] = {
    "/rerank": (RerankRequest, InfinityRerankRequest),
    "/classify": (VllmClassifyRequest, InfinityClassifyRequest),
}


def rerank_dialect(data: Any) -> str:
    if isinstance(data, dict) and "documents" in data and "texts" not in data:
        return "infinity"
    return "tei"


def classify_dialect(data: Any) -> str:
    return "infinity" if isinstance(data, dict) and "raw_scores" in data else "vllm"


def _request_body(path: str) -> dict[str, Any]:
    refs = [{"$ref": f"#/components/schemas/{model.__name__}"} for model in BODIES[path]]
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"anyOf": refs}}},
        }
    }


@router.post(
    "/rerank",
    summary="Score (query, text) pairs with a cross-encoder; best first, ties by index "
    "(TEI's body, or Infinity's with `documents`)",
    openapi_extra=_request_body("/rerank"),
)
async def rerank(request: Request) -> Response:
    data = await read_json(request)
    if rerank_dialect(data) == "infinity":
        set_dialect(request.scope, "infinity")
        return await infinity.rerank(validate(InfinityRerankRequest, data), request)
    return await tei.rerank(validate(RerankRequest, data), request)


@router.post(
    "/classify",
    summary="Classify texts: vLLM's answer, or Infinity's for a body with `raw_scores`",
    openapi_extra=_request_body("/classify"),
)
async def classify(request: Request) -> Response:
    data = await read_json(request)
    if classify_dialect(data) == "infinity":
        set_dialect(request.scope, "infinity")
        return await infinity.classify(validate(InfinityClassifyRequest, data), request)
    return await vllm.run_classify(validate(VllmClassifyRequest, data), request)
