"""/tokenize and /decode."""

from __future__ import annotations

from dataclasses import asdict

from fastapi import APIRouter, Request
from starlette.responses import Response

from vectorpress.api.native.common import json_response
from vectorpress.api.native.schemas import DecodeRequest, TokenizeRequest
from vectorpress.api.routing import infer_for

router = APIRouter(tags=["Text Embeddings Inference"])


@router.post("/tokenize", summary="Tokens of each input with byte offsets; specials flagged")
async def tokenize(body: TokenizeRequest, request: Request) -> Response:
    inputs = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    tokens = await infer_for(request, body.model).tokenize(
        inputs, add_special_tokens=body.add_special_tokens, prompt_name=body.prompt_name
    )
    return json_response([[asdict(t) for t in one] for one in tokens])


@router.post("/decode", summary="Text of each list of token ids")
async def decode(body: DecodeRequest, request: Request) -> Response:
    ids = body.ids
    # A flat list (also an empty one) is one sequence, as in TEI.
    batch = [ids] if not ids or isinstance(ids[0], int) else ids
    texts = await infer_for(request, body.model).decode(
        batch,  # type: ignore[arg-type]
        skip_special_tokens=body.skip_special_tokens,
    )
    return json_response(texts)
