"""Jina's, vLLM's and Infinity's documented bodies posted with httpx, and the `openai` SDK with
each extension of /v1/embeddings, against live servers. Golden answers: each provider's shape,
exactly, with values equal to TEI's own routes on the same inputs."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import openai
import pytest
import torch

from tests.api.conftest import post
from tests.helpers.server import LiveServer

QUERY = "What is the capital of France?"
DOCS = [
    "Paris is the capital of France.",
    "Berlin is the capital of Germany.",
    "The Eiffel tower is in Paris.",
    "Cheese is made from milk.",
]
TEXTS = ["hello world", "the quick brown fox", "vector databases store embeddings"]


def ok(server: LiveServer, path: str, body: Any) -> Any:
    response = post(server, path, body)
    assert response.status_code == 200, (path, response.text)
    assert response.headers["content-type"] == "application/json"
    return response.json()


def tei_scores(server: LiveServer, texts: list[str] = DOCS, raw: bool = False) -> dict[int, float]:
    ranks = ok(server, "/rerank", {"query": QUERY, "texts": texts, "raw_scores": raw})
    return {r["index"]: r["score"] for r in ranks}


def tei_embed(server: LiveServer, texts: Any, **extra: Any) -> np.ndarray:
    return np.array(ok(server, "/embed", {"inputs": texts, **extra}), dtype=np.float32)


def f32(values: Any) -> np.ndarray:
    """JSON numbers (parsed as doubles) back to the float32 values they were written from."""
    return np.array(values, dtype=np.float32)


def best_first(scores: dict[int, float]) -> list[int]:
    return sorted(scores, key=lambda i: (scores[i], i), reverse=True)


# -- Jina ----------------------------------------------------------------------------------------


def test_jina_rerank_body_and_answer(reranker_server: LiveServer) -> None:
    body = {
        "model": "jina-reranker-v2-base-multilingual",
        "query": QUERY,
        "documents": [DOCS[0], {"text": DOCS[1]}, DOCS[2], {"text": DOCS[3]}],
        "top_n": 3,
        "return_documents": True,
    }
    answer = ok(reranker_server, "/v1/rerank", body)
    expected = tei_scores(reranker_server)
    assert {"model", "usage", "results"} <= set(answer)
    assert answer["usage"]["total_tokens"] > 0
    assert [r["index"] for r in answer["results"]] == best_first(expected)[:3]
    for r in answer["results"]:
        assert set(r) == {"index", "relevance_score", "document"}
        assert r["relevance_score"] == expected[r["index"]]
        assert r["document"] == {"text": DOCS[r["index"]]}


def test_jina_embeddings_extras(embedding_server: LiveServer) -> None:
    body = {"model": "jina-embeddings-v3", "input": TEXTS, "task": "retrieval.query"}
    floats = tei_embed(embedding_server, TEXTS, prompt_name="query")
    answer = ok(embedding_server, "/v1/embeddings", {**body, "embedding_type": "float"})
    np.testing.assert_array_equal(f32([d["embedding"] for d in answer["data"]]), floats)
    binary = ok(embedding_server, "/v1/embeddings", {**body, "embedding_type": "binary"})
    packed = np.packbits(floats > 0, axis=-1).astype(np.int16)
    np.testing.assert_array_equal([d["embedding"] for d in binary["data"]], packed - 128)
    ubinary = ok(embedding_server, "/v1/embeddings", {**body, "embedding_type": "ubinary"})
    np.testing.assert_array_equal([d["embedding"] for d in ubinary["data"]], packed)
    b64 = ok(embedding_server, "/v1/embeddings", {**body, "embedding_type": "base64"})
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in b64["data"]]
    np.testing.assert_array_equal(decoded, floats)
    raw = ok(embedding_server, "/v1/embeddings", {**body, "normalized": False})
    np.testing.assert_array_equal(
        f32([d["embedding"] for d in raw["data"]]),
        tei_embed(embedding_server, TEXTS, prompt_name="query", normalize=False),
    )
    passage = ok(embedding_server, "/v1/embeddings", {**body, "task": "retrieval.passage"})
    np.testing.assert_array_equal(
        f32([d["embedding"] for d in passage["data"]]),
        tei_embed(embedding_server, TEXTS, prompt_name="passage"),
    )
    # A task the model has no prompt for embeds with none.
    matching = ok(embedding_server, "/v1/embeddings", {**body, "task": "text-matching"})
    np.testing.assert_array_equal(
        f32([d["embedding"] for d in matching["data"]]), tei_embed(embedding_server, TEXTS)
    )


# -- vLLM ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
def test_vllm_score_cross_encoder(reranker_server: LiveServer, path: str) -> None:
    answer = ok(reranker_server, path, {"model": "m", "text_1": QUERY, "text_2": DOCS})
    assert set(answer) == {"id", "object", "created", "model", "data", "usage"}
    assert answer["object"] == "list" and answer["id"].startswith("score-")
    expected = tei_scores(reranker_server)
    assert answer["data"] == [
        {"index": i, "object": "score", "score": expected[i]} for i in range(len(DOCS))
    ]
    raw = ok(
        reranker_server,
        path,
        {"queries": [QUERY], "documents": DOCS, "use_activation": False},
    )
    raw_expected = tei_scores(reranker_server, raw=True)
    assert [d["score"] for d in raw["data"]] == [raw_expected[i] for i in range(len(DOCS))]
    assert raw["usage"]["prompt_tokens"] == raw["usage"]["total_tokens"] > 0


def test_vllm_score_embedder_is_cosine(embedding_server: LiveServer) -> None:
    answer = ok(embedding_server, "/score", {"text_1": TEXTS[0], "text_2": TEXTS[1:]})
    similarity = ok(
        embedding_server,
        "/similarity",
        {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}},
    )
    np.testing.assert_allclose([d["score"] for d in answer["data"]], similarity, rtol=1e-6)
    zipped = ok(embedding_server, "/score", {"text_1": TEXTS, "text_2": TEXTS})
    np.testing.assert_allclose([d["score"] for d in zipped["data"]], [1, 1, 1], rtol=1e-6)


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_vllm_rerank_raw_and_sigmoid(reranker_server: LiveServer, path: str) -> None:
    body = {"model": "BAAI/bge-reranker-base", "query": QUERY, "documents": DOCS}
    sigmoid = ok(reranker_server, path, body)
    expected = tei_scores(reranker_server)
    assert {r["index"]: r["relevance_score"] for r in sigmoid["results"]} == expected
    assert [r["index"] for r in sigmoid["results"]] == best_first(expected)
    raw = ok(reranker_server, path, {**body, "use_activation": False, "top_n": 2})
    raw_expected = tei_scores(reranker_server, raw=True)
    assert [(r["index"], r["relevance_score"]) for r in raw["results"]] == [
        (i, raw_expected[i]) for i in best_first(raw_expected)[:2]
    ]
    assert set(raw) >= {"id", "model", "usage", "results"}


@pytest.mark.parametrize("path", ["/classify", "/v1/classify"])
def test_vllm_classify(classifier_server: LiveServer, path: str) -> None:
    texts = ["I like you.", "I hate rainy days."]
    answer = ok(classifier_server, path, {"model": "m", "input": texts})
    assert set(answer) == {"id", "object", "created", "model", "data", "usage"}
    predicted = ok(classifier_server, "/predict", {"inputs": [[t] for t in texts]})
    for item, expected in zip(answer["data"], predicted, strict=True):
        by_label = {p["label"]: p["score"] for p in expected}
        assert item["label"] == expected[0]["label"]
        assert item["num_classes"] == len(by_label) == len(item["probs"])
        assert sorted(item["probs"], reverse=True) == [p["score"] for p in expected]
    assert [d["index"] for d in answer["data"]] == [0, 1]


def test_vllm_detokenize(embedding_server: LiveServer) -> None:
    ids = [t["id"] for t in ok(embedding_server, "/tokenize", {"inputs": "hello world"})[0]]
    answer = ok(embedding_server, "/detokenize", {"model": "m", "tokens": ids})
    assert answer == {"prompt": ok(embedding_server, "/decode", {"ids": ids})[0]}


def test_models_listing(embedding_server: LiveServer) -> None:
    for path in ("/v1/models", "/models"):
        response = embedding_server_get(embedding_server, path)
        assert response["object"] == "list"
        (card,) = response["data"]
        assert card["object"] == "model" and card["id"] == str(embedding_server.infer.spec.path)
        assert card["capabilities"] == ["embed"] and card["max_model_len"] == 128


def embedding_server_get(server: LiveServer, path: str) -> Any:
    import httpx

    response = httpx.get(f"{server.url}{path}", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


# -- Infinity ------------------------------------------------------------------------------------


def test_infinity_rerank(reranker_server: LiveServer) -> None:
    body = {"model": "mixedbread-ai/mxbai-rerank-xsmall-v1", "query": QUERY, "documents": DOCS}
    answer = ok(reranker_server, "/rerank", {**body, "return_documents": True})
    assert set(answer) == {"object", "results", "model", "usage", "id", "created"}
    assert answer["object"] == "rerank" and answer["id"].startswith("infinity-")
    expected = tei_scores(reranker_server)
    assert answer["results"] == [
        {"relevance_score": expected[i], "index": i, "document": DOCS[i]}
        for i in best_first(expected)
    ]
    raw = ok(reranker_server, "/rerank", {**body, "raw_scores": True, "top_n": 1})
    raw_expected = tei_scores(reranker_server, raw=True)
    (top,) = raw["results"]
    assert top == {
        "relevance_score": raw_expected[best_first(raw_expected)[0]],
        "index": best_first(raw_expected)[0],
        "document": None,
    }
    # TEI's own body on the same path is answered exactly as before.
    tei = ok(reranker_server, "/rerank", {"query": QUERY, "texts": DOCS})
    assert tei == [{"index": i, "score": expected[i]} for i in best_first(expected)]


def test_infinity_classify(classifier_server: LiveServer) -> None:
    texts = ["I like you.", "I hate rainy days."]
    for raw in (False, True):
        answer = ok(classifier_server, "/classify", {"input": texts, "raw_scores": raw})
        assert set(answer) == {"object", "data", "model", "usage", "id", "created"}
        assert answer["object"] == "classify"
        predicted = ok(
            classifier_server, "/predict", {"inputs": [[t] for t in texts], "raw_scores": raw}
        )
        assert answer["data"] == predicted


def test_infinity_embeddings_is_openai_route(embedding_server: LiveServer) -> None:
    answer = ok(embedding_server, "/embeddings", {"input": TEXTS, "model": "m", "modality": "text"})
    np.testing.assert_array_equal(
        f32([d["embedding"] for d in answer["data"]]), tei_embed(embedding_server, TEXTS)
    )


# -- the openai SDK with each extension ----------------------------------------------------------


@pytest.fixture(scope="module")
def oai(embedding_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{embedding_server.url}/v1", api_key="unused", max_retries=0)


def _strings(result: Any) -> list[bytes]:
    return [base64.b64decode(d.embedding) for d in result.data]


def test_openai_sdk_half_precision_base64(oai: openai.OpenAI, embedding_server: LiveServer) -> None:
    floats = tei_embed(embedding_server, TEXTS)
    f16 = oai.embeddings.create(
        input=TEXTS, model="m", encoding_format="base64", extra_body={"embed_dtype": "float16"}
    )
    got = np.stack([np.frombuffer(b, "<f2") for b in _strings(f16)])
    np.testing.assert_array_equal(got, floats.astype(np.float16))
    bf16 = oai.embeddings.create(
        input=TEXTS, model="m", encoding_format="base64", extra_body={"embed_dtype": "bfloat16"}
    )
    bits = np.stack([np.frombuffer(b, "<u2") for b in _strings(bf16)])
    reference = torch.from_numpy(floats).to(torch.bfloat16).view(torch.int16).numpy()
    np.testing.assert_array_equal(bits, reference.view(np.uint16))
    # bfloat16 as JSON numbers: the same values, widened.
    as_json = oai.embeddings.create(
        input=TEXTS, model="m", encoding_format="float", extra_body={"embed_dtype": "bfloat16"}
    )
    widened = torch.from_numpy(floats).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(f32([d.embedding for d in as_json.data]), widened)


def test_openai_sdk_integer_encodings(oai: openai.OpenAI, embedding_server: LiveServer) -> None:
    floats = tei_embed(embedding_server, TEXTS)
    packed = np.packbits(floats > 0, axis=-1)
    ubinary = oai.embeddings.create(
        input=TEXTS, model="m", encoding_format="float", extra_body={"encoding_format": "ubinary"}
    )
    np.testing.assert_array_equal([d.embedding for d in ubinary.data], packed)
    b64 = oai.embeddings.create(
        input=TEXTS, model="m", encoding_format="base64", extra_body={"embed_dtype": "binary"}
    )
    got = np.stack([np.frombuffer(b, np.int8) for b in _strings(b64)])
    np.testing.assert_array_equal(got, packed.astype(np.int16) - 128)
    jina = oai.embeddings.create(input=TEXTS, model="m", extra_body={"embedding_type": "int8"})
    int8 = np.array([d.embedding for d in jina.data])
    assert int8.shape == floats.shape and int8.min() >= -128 and int8.max() <= 127


def test_openai_sdk_jina_task_and_vllm_truncation(
    oai: openai.OpenAI, embedding_server: LiveServer
) -> None:
    query = oai.embeddings.create(
        input=TEXTS, model="m", encoding_format="float", extra_body={"task": "retrieval.query"}
    )
    np.testing.assert_array_equal(
        f32([d.embedding for d in query.data]),
        tei_embed(embedding_server, TEXTS, prompt_name="query"),
    )
    long_text = "the quick brown fox jumps over the lazy dog " * 40  # over 128 tokens
    cut = oai.embeddings.create(
        input=[long_text],
        model="m",
        encoding_format="float",
        extra_body={"truncate_prompt_tokens": 10},
    )
    assert cut.usage.total_tokens == 10
    first = " ".join(long_text.split()[:8])  # 8 word tokens and [CLS], [SEP]
    np.testing.assert_array_equal(f32(cut.data[0].embedding), tei_embed(embedding_server, first)[0])
    to_max = oai.embeddings.create(
        input=[long_text],
        model="m",
        encoding_format="float",
        extra_body={"truncate_prompt_tokens": -1},
    )
    assert to_max.usage.total_tokens == 128
    # Without the extension the server's --auto-truncate false refuses the same text.
    with pytest.raises(openai.UnprocessableEntityError):
        oai.embeddings.create(input=[long_text], model="m", encoding_format="float")
