"""Bad input on every route of the other dialects: a clear 4xx in that dialect's own error
shape (and status from the one error table), and the server keeps serving."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import post
from tests.helpers.server import LiveServer

DOCS = ["a", "b", "c"]
NINE = [f"doc {i}" for i in range(9)]  # over the fixtures' --max-client-batch-size 8


def shape_of(body: dict[str, Any]) -> str:
    keys = set(body)
    if keys == {"id", "message"}:
        return "cohere"
    if keys == {"id", "message", "detail"}:
        return "cohere+jina"
    if keys == {"id", "message", "error"}:
        return "cohere+vllm"
    if keys == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}:
        return "nested"
    if keys == {"message", "code", "type"}:
        return "openai"
    if keys == {"error", "error_type"}:
        return "tei"
    return f"unknown: {body}"


def message_of(body: dict[str, Any]) -> str:
    error = body.get("error")
    if isinstance(error, dict):
        return str(error["message"])
    return str(body.get("message") or body.get("error"))


RERANKER_CASES = [
    # path, body, status, shape, words in the message
    ("/v2/rerank", {"query": 5, "documents": DOCS}, 422, "cohere+vllm", "query"),
    ("/v2/rerank", {"query": "q", "documents": []}, 400, "cohere+vllm", "empty"),
    ("/v2/rerank", {"query": "q", "documents": DOCS, "top_n": 0}, 422, "cohere+vllm", "top_n"),
    ("/v2/rerank", {"query": "q", "documents": DOCS, "top_n": 4}, 422, "cohere+vllm", "top_n"),
    ("/v2/rerank", {"query": "q", "documents": NINE}, 422, "cohere+vllm", "batch size"),
    (
        "/v2/rerank",
        {"query": "q", "documents": DOCS, "max_tokens_per_doc": 0},
        422,
        "cohere+vllm",
        "token limit",
    ),
    ("/v1/rerank", {"query": "q", "documents": "abc"}, 422, "cohere+jina", "documents"),
    ("/v1/rerank", {"query": "q", "documents": []}, 400, "cohere+jina", "empty"),
    ("/v1/rerank", {"query": "q", "documents": DOCS, "top_n": -1}, 422, "cohere+jina", "top_n"),
    ("/v1/rerank", {"query": "q", "documents": NINE}, 422, "cohere+jina", "batch size"),
    ("/v1/rerank", {"query": "q", "documents": [{"title": "x"}]}, 422, "cohere+jina", "text"),
    (
        "/v1/rerank",
        {"query": "q", "documents": [{"title": "x"}], "rank_fields": ["body"]},
        422,
        "cohere+jina",
        "rank_fields",
    ),
    ("/rerank", {"query": "q", "documents": []}, 400, "nested", "empty"),
    ("/rerank", {"query": "q", "documents": "x"}, 422, "nested", "documents"),
    ("/rerank", {"query": "q", "documents": DOCS, "top_n": 0}, 422, "nested", "top_n"),
    ("/rerank", {"query": "q", "documents": NINE}, 422, "nested", "batch size"),
    ("/rerank", {"query": "q"}, 422, "tei", "texts"),
    ("/score", {"text_1": "q"}, 422, "nested", "text_2"),
    ("/score", {"text_1": ["a", "b"], "text_2": DOCS}, 422, "nested", "left texts"),
    ("/score", {"text_1": "q", "text_2": []}, 400, "nested", "nothing"),
    ("/v1/score", {"text_1": 3, "text_2": "x"}, 422, "nested", "text_1"),
    ("/v1/score", {"text_1": "q", "text_2": NINE}, 422, "nested", "batch size"),
    (
        "/score",
        {"text_1": "q", "text_2": "x", "truncate_prompt_tokens": 5},
        422,
        "nested",
        "truncate_prompt_tokens",
    ),
    ("/v2/embed", {"texts": ["x"]}, 424, "cohere", "embedding model"),
    ("/detokenize", {"tokens": "x"}, 422, "nested", "tokens"),
    ("/detokenize", {"tokens": []}, 400, "nested", "empty"),
]

EMBEDDER_CASES = [
    ("/v2/embed", {"texts": "x"}, 422, "cohere", "texts"),
    ("/v2/embed", {"texts": []}, 400, "cohere", "empty"),
    ("/v2/embed", {"texts": NINE}, 422, "cohere", "batch size"),
    ("/v2/embed", {"texts": ["x"], "embedding_types": ["int4"]}, 422, "cohere", "int4"),
    ("/v2/embed", {"texts": ["x"], "embedding_types": []}, 422, "cohere", "embedding_types"),
    ("/v2/embed", {"texts": ["x"], "output_dimension": 4096}, 422, "cohere", "dimension"),
    ("/v2/embed", {"texts": ["x"], "output_dimension": 0}, 422, "cohere", "dimensions"),
    ("/v2/embed", {"texts": ["x"], "truncate": "MIDDLE"}, 422, "cohere", "truncate"),
    ("/v2/embed", {"texts": ["word " * 300], "truncate": "NONE"}, 422, "cohere", "tokens"),
    ("/v2/embed", {"images": ["data:x"]}, 422, "cohere", "images"),
    ("/v2/embed", {"texts": ["x"], "input_type": "image"}, 422, "cohere", "images"),
    ("/v1/embed", {"texts": [1, 2]}, 422, "cohere", "texts"),
    ("/v1/embed", {"texts": ["x"], "embedding_types": ["float", "nope"]}, 422, "cohere", "nope"),
    ("/v2/rerank", {"query": "q", "documents": DOCS}, 424, "cohere+vllm", "re-ranker"),
    ("/classify", {"input": ["x"]}, 424, "nested", "classifier"),
    ("/classify", {"input": "x", "raw_scores": False}, 422, "nested", "input"),
    ("/v1/classify", {"input": 7}, 422, "nested", "input"),
    ("/v1/classify", {"input": NINE}, 424, "nested", "classifier"),
    ("/v1/embeddings", {"input": "x", "embedding_type": "int4"}, 422, "openai", "embedding_type"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "fp8"}, 422, "openai", "encoding_format"),
    (
        "/v1/embeddings",
        {"input": "x", "encoding_format": "int8", "embed_dtype": "uint8"},
        422,
        "openai",
        "disagree",
    ),
    ("/v1/embeddings", {"input": "x", "task": "poetry"}, 422, "openai", "task"),
    ("/v1/embeddings", {"input": "x", "truncate_prompt_tokens": 0}, 422, "openai", "truncate"),
    ("/v1/embeddings", {"input": "x", "truncate_prompt_tokens": 2}, 422, "openai", "special"),
    ("/embeddings", {"input": ["x"] * 9, "embedding_type": "binary"}, 422, "openai", "batch"),
]


def check(server: LiveServer, path: str, body: Any, status: int, shape: str, words: str) -> None:
    response = post(server, path, body)
    assert response.status_code == status, (path, body, response.text)
    assert response.headers["content-type"].startswith("application/json")
    answer = response.json()
    assert shape_of(answer) == shape, (path, answer)
    assert words in message_of(answer), (path, answer)


@pytest.mark.parametrize(("path", "body", "status", "shape", "words"), RERANKER_CASES)
def test_reranker_routes(
    reranker_server: LiveServer, path: str, body: Any, status: int, shape: str, words: str
) -> None:
    check(reranker_server, path, body, status, shape, words)


@pytest.mark.parametrize(("path", "body", "status", "shape", "words"), EMBEDDER_CASES)
def test_embedder_routes(
    embedding_server: LiveServer, path: str, body: Any, status: int, shape: str, words: str
) -> None:
    check(embedding_server, path, body, status, shape, words)


def test_not_json_and_still_serving(
    reranker_server: LiveServer, embedding_server: LiveServer
) -> None:
    import httpx

    for path in ("/v2/rerank", "/v1/rerank", "/rerank", "/score", "/classify"):
        response = httpx.post(
            f"{reranker_server.url}{path}",
            content=b"{not json",
            headers={"content-type": "application/json"},
        )
        assert response.status_code in (400, 422), (path, response.text)
        assert shape_of(response.json()) != "unknown", response.text
    ok = post(reranker_server, "/v2/rerank", {"query": "q", "documents": DOCS})
    assert ok.status_code == 200
    ok = post(embedding_server, "/v2/embed", {"texts": ["x"], "embedding_types": ["int8"]})
    assert ok.status_code == 200
