"""POST /score, /v1/score, /v1/classify and /detokenize in vLLM's shapes (its /v1/models is
OpenAI's listing; /classify is shared with Infinity: see api/clash.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import Response

from vectorpress.api import adapters
from vectorpress.api.headers import timing_headers
from vectorpress.api.native.common import json_response, priority_header
from vectorpress.api.native.schemas import lane_name
from vectorpress.api.routing import infer_for
from vectorpress.api.vllm.schemas import DetokenizeRequest, ScoreRequest, VllmClassifyRequest
from vectorpress.core import postprocess
from vectorpress.core.infer import Infer, Result
from vectorpress.core.tokenization import PairInput
from vectorpress.errors import EmptyError, ModelTypeError, ValidationError

router = APIRouter(tags=["vLLM"])

_PAIRS = (
    ("text_1", "text_2"),
    ("queries", "documents"),
    ("queries", "items"),
    ("data_1", "data_2"),
)


def _truncate(tokens: int | None) -> bool | None:
    """vLLM's `truncate_prompt_tokens` where only the model's maximum can apply (pairs)."""
    if tokens is None:
        return None
    if tokens == -1:
        return True
    raise ValidationError(
        "Input validation error: `truncate_prompt_tokens` takes -1 (the model's maximum) here"
    )


def _as_list(texts: str | list[str]) -> list[str]:
    return [texts] if isinstance(texts, str) else list(texts)


def pairs(body: ScoreRequest) -> tuple[list[str], list[str]]:
    """The (left, right) texts of each pair, one left text repeated for every right one."""
    for left_name, right_name in _PAIRS:
        left, right = getattr(body, left_name), getattr(body, right_name)
        if left is not None and right is not None:
            break
    else:
        raise ValidationError(
            "Input validation error: give `text_1` and `text_2` (or `queries` and `documents`)"
        )
    lefts, rights = _as_list(left), _as_list(right)
    if not lefts or not rights:
        raise EmptyError("Input validation error: nothing to score")
    if len(lefts) == 1:
        lefts = lefts * len(rights)
    if len(lefts) != len(rights):
        raise ValidationError(
            f"Input validation error: {len(lefts)} left texts for {len(rights)} right ones; "
            "give one left text or as many as right texts"
        )
    return lefts, rights


def usage(result: Result[Any]) -> dict[str, int]:
    return {"prompt_tokens": result.tokens, "total_tokens": result.tokens, "completion_tokens": 0}


async def _scores(
    infer: Infer, body: ScoreRequest, lefts: list[str], rights: list[str], priority: str | None
) -> tuple[list[float], Result[Any]]:
    truncate = _truncate(body.truncate_prompt_tokens)
    if infer.spec.kind == "reranker":
        inputs: list[PairInput] = list(zip(lefts, rights, strict=True))
        predicted = await infer.predict(
            inputs,
            truncate=truncate,
            raw_scores=body.use_activation is False,
            batch=True,
            priority=priority,
        )
        return [one[0][1] for one in predicted.values], predicted
    if infer.spec.has_multi_vector:
        # As /rerank scores them: bge-m3's combined score, a ColBERT model's MaxSim.
        late = await infer.score_multi(lefts, rights, truncate=truncate, priority=priority)
        return late.values, late
    if infer.spec.kind == "embedding":
        # Cosine of the pooled vectors, each distinct text embedded once.
        texts = list(dict.fromkeys([*lefts, *rights]))
        embedded = await infer.embed(
            texts, truncate=truncate, normalize=False, batch=True, priority=priority
        )
        vectors = dict(zip(texts, embedded.values, strict=True))
        cosines = [
            postprocess.cosine(vectors[a], vectors[b]) for a, b in zip(lefts, rights, strict=True)
        ]
        return cosines, embedded
    raise ModelTypeError("Backend error: scores need a re-ranker or an embedding model")


@router.post(
    "/score",
    summary="vLLM score: a cross-encoder's pair scores, an embedder's cosine, or a bge-m3 or "
    "ColBERT model's late-interaction score",
)
async def score(body: ScoreRequest, request: Request) -> Response:
    infer = infer_for(request, body.model)
    lefts, rights = pairs(body)
    scores, result = await _scores(
        infer, body, lefts, rights, lane_name(body.priority, priority_header(request))
    )
    payload = {
        "id": adapters.new_id("score-"),
        "object": "list",
        "created": adapters.now(),
        "model": adapters.served_name(request, body.model),
        "data": [
            {"index": i, "object": "score", "score": np.float32(s)} for i, s in enumerate(scores)
        ],
        "usage": usage(result),
    }
    return json_response(payload, timing_headers(result))


router.add_api_route("/v1/score", score, methods=["POST"], summary="Alias of /score")


async def run_classify(body: VllmClassifyRequest, request: Request) -> Response:
    infer = infer_for(request, body.model)
    texts = _as_list(body.input)
    result = await infer.predict(
        texts,
        truncate=_truncate(body.truncate_prompt_tokens),
        raw_scores=body.use_activation is False,
        batch=True,
    )
    label2id = infer.spec.label2id
    data = []
    for i, labelled in enumerate(result.values):
        probs = [0.0] * len(label2id)
        for label, s in labelled:
            probs[label2id[label]] = s
        data.append(
            {
                "index": i,
                "label": labelled[0][0],
                "probs": np.asarray(probs, dtype=np.float32),
                "num_classes": len(probs),
            }
        )
    payload = {
        "id": adapters.new_id("classify-"),
        "object": "list",
        "created": adapters.now(),
        "model": adapters.served_name(request, body.model),
        "data": data,
        "usage": usage(result),
    }
    return json_response(payload, timing_headers(result))


@router.post("/v1/classify", summary="vLLM classify: per input, the best label and every class")
async def classify(body: VllmClassifyRequest, request: Request) -> Response:
    return await run_classify(body, request)


@router.post("/detokenize", summary="vLLM detokenize: the text of token ids")
async def detokenize(body: DetokenizeRequest, request: Request) -> Response:
    infer = infer_for(request, body.model)
    if not body.tokens:
        raise EmptyError("Input validation error: `tokens` cannot be empty")
    texts = await infer.decode([body.tokens])
    return json_response({"prompt": texts[0]})
