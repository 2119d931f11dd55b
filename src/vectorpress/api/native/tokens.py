"""/tokenize and /decode."""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import APIRouter, Request
from starlette.responses import Response

from vectorpress.api import answers
from vectorpress.api.native.schemas import DecodeRequest, TokenizeRequest
from vectorpress.api.routing import infer_for
from vectorpress.core.tokenization import Tokens

router = APIRouter(tags=["Text Embeddings Inference"])


@router.post("/tokenize", summary="Tokens of each input with byte offsets; specials flagged")
async def tokenize(body: TokenizeRequest, request: Request) -> Response:
    inputs = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    tokens = await infer_for(request, body.model).tokenize(
        inputs, add_special_tokens=body.add_special_tokens, prompt_name=body.prompt_name
    )
    content = await answers.off_loop(sum(map(len, tokens)), tokens_json, tokens)
    return Response(content, media_type="application/json")


def tokens_json(tokens: list[Tokens]) -> bytes:
    """TEI's SimpleToken objects, one list per input, made a chunk at a time."""
    parts = [b"["]
    for i, t in enumerate(tokens):
        if i:
            parts.append(b",")
        answers.array_into(parts, _rows(t))
    parts.append(b"]")
    return b"".join(parts)


def _rows(t: Tokens) -> Iterator[list[dict[str, object]]]:
    step = answers.CHUNK_VALUES
    for lo in range(0, len(t), step):
        hi = lo + step
        yield [
            {"id": i, "text": x, "special": s, "start": a, "stop": b}
            for i, x, s, a, b in zip(
                t.ids[lo:hi],
                t.texts[lo:hi],
                t.special[lo:hi],
                t.starts[lo:hi],
                t.stops[lo:hi],
                strict=True,
            )
        ]


@router.post("/decode", summary="Text of each list of token ids")
async def decode(body: DecodeRequest, request: Request) -> Response:
    ids = body.ids
    # A flat list (also an empty one) is one sequence, as in TEI.
    batch = [ids] if not ids or isinstance(ids[0], int) else ids
    texts = await infer_for(request, body.model).decode(
        batch,  # type: ignore[arg-type]
        skip_special_tokens=body.skip_special_tokens,
    )
    return Response(await answers.json_body(texts), media_type="application/json")
