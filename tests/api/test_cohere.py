"""The real `cohere` SDK (ClientV2 and the v1 Client) against live servers: rerank and embed,
every embedding type, and errors surfacing as the SDK's own exceptions."""

from __future__ import annotations

import base64

import cohere
import numpy as np
import pytest
from cohere.core.api_error import ApiError

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


def v2(server: LiveServer) -> cohere.ClientV2:
    return cohere.ClientV2(api_key="unused", base_url=server.url, timeout=60)


def v1(server: LiveServer) -> cohere.Client:
    return cohere.Client(api_key="unused", base_url=server.url, timeout=60)


def tei_rerank(server: LiveServer, raw: bool = False) -> dict[int, float]:
    response = post(server, "/rerank", {"query": QUERY, "texts": DOCS, "raw_scores": raw})
    assert response.status_code == 200, response.text
    return {r["index"]: r["score"] for r in response.json()}


def tei_embed(server: LiveServer, texts: list[str], **extra: object) -> np.ndarray:
    response = post(server, "/embed", {"inputs": texts, **extra})
    assert response.status_code == 200, response.text
    return np.array(response.json(), dtype=np.float32)


def test_v2_rerank_equals_tei_scores(reranker_server: LiveServer) -> None:
    result = v2(reranker_server).rerank(model="any-name", query=QUERY, documents=DOCS)
    expected = tei_rerank(reranker_server)
    assert [r.index for r in result.results] == sorted(expected, key=lambda i: -expected[i])
    assert {r.index: r.relevance_score for r in result.results} == expected
    assert result.id and result.meta is not None
    assert result.meta.api_version is not None and result.meta.api_version.version == "2"


def test_v2_rerank_top_n(reranker_server: LiveServer) -> None:
    result = v2(reranker_server).rerank(model="m", query=QUERY, documents=DOCS, top_n=2)
    expected = tei_rerank(reranker_server)
    best = sorted(expected, key=lambda i: -expected[i])[:2]
    assert [r.index for r in result.results] == best


def test_v1_rerank_documents_and_rank_fields(reranker_server: LiveServer) -> None:
    client = v1(reranker_server)
    result = client.rerank(model="m", query=QUERY, documents=DOCS, top_n=3, return_documents=True)
    expected = tei_rerank(reranker_server)
    assert len(result.results) == 3
    for r in result.results:
        assert r.relevance_score == expected[r.index]
        assert r.document is not None and r.document.text == DOCS[r.index]
    records = [{"title": f"doc {i}", "body": d} for i, d in enumerate(DOCS)]
    fielded = client.rerank(model="m", query=QUERY, documents=records, rank_fields=["body"])
    # Ranked on the `body` field alone, written `body: <text>`.
    texts = [f"body: {d}" for d in DOCS]
    response = post(reranker_server, "/rerank", {"query": QUERY, "texts": texts})
    same = {r["index"]: r["score"] for r in response.json()}
    assert {r.index: r.relevance_score for r in fielded.results} == same


def test_v2_embed_every_type(embedding_server: LiveServer) -> None:
    kinds = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
    result = v2(embedding_server).embed(
        model="m", texts=TEXTS, input_type="clustering", embedding_types=kinds
    )
    floats = np.array(result.embeddings.float_, dtype=np.float32)
    np.testing.assert_array_equal(floats, tei_embed(embedding_server, TEXTS))
    dims = floats.shape[1]
    int8 = np.array(result.embeddings.int8)
    uint8 = np.array(result.embeddings.uint8)
    assert int8.shape == uint8.shape == floats.shape
    assert int8.min() >= -128 and int8.max() <= 127 and uint8.min() >= 0 and uint8.max() <= 255
    np.testing.assert_array_equal(uint8 - 128, int8)
    packed = np.packbits(floats > 0, axis=-1)
    np.testing.assert_array_equal(np.array(result.embeddings.ubinary), packed)
    np.testing.assert_array_equal(np.array(result.embeddings.binary), packed.astype(int) - 128)
    assert len(result.embeddings.binary[0]) == dims // 8
    decoded = [np.frombuffer(base64.b64decode(s), "<f4") for s in result.embeddings.base64]
    np.testing.assert_array_equal(np.stack(decoded), floats)
    assert result.texts == TEXTS
    assert result.meta.billed_units.input_tokens > 0


def test_v2_embed_input_type_uses_the_model_prompts(embedding_server: LiveServer) -> None:
    client = v2(embedding_server)
    query = client.embed(
        model="m", texts=TEXTS, input_type="search_query", embedding_types=["float"]
    )
    doc = client.embed(
        model="m", texts=TEXTS, input_type="search_document", embedding_types=["float"]
    )
    np.testing.assert_array_equal(
        np.array(query.embeddings.float_, dtype=np.float32),
        tei_embed(embedding_server, TEXTS, prompt_name="query"),
    )
    # The test model names its document prompt `passage`.
    np.testing.assert_array_equal(
        np.array(doc.embeddings.float_, dtype=np.float32),
        tei_embed(embedding_server, TEXTS, prompt_name="passage"),
    )


def test_v2_embed_output_dimension(embedding_server: LiveServer) -> None:
    result = v2(embedding_server).embed(
        model="m",
        texts=TEXTS,
        input_type="clustering",
        embedding_types=["float", "ubinary"],
        output_dimension=16,
    )
    floats = np.array(result.embeddings.float_, dtype=np.float32)
    np.testing.assert_array_equal(floats, tei_embed(embedding_server, TEXTS, dimensions=16))
    assert np.array(result.embeddings.ubinary).shape == (3, 2)


def test_v1_embed_floats_and_by_type(embedding_server: LiveServer) -> None:
    client = v1(embedding_server)
    floats = client.embed(model="m", texts=TEXTS, input_type="clustering")
    assert floats.response_type == "embeddings_floats"
    np.testing.assert_array_equal(
        np.array(floats.embeddings, dtype=np.float32), tei_embed(embedding_server, TEXTS)
    )
    typed = client.embed(
        model="m", texts=TEXTS, input_type="clustering", embedding_types=["int8", "binary"]
    )
    assert typed.response_type == "embeddings_by_type"
    assert np.array(typed.embeddings.int8).shape == np.array(floats.embeddings).shape


@pytest.mark.parametrize(
    ("call", "exception", "needle"),
    [
        (lambda c: c.rerank(model="m", query=QUERY, documents=[]), cohere.BadRequestError, "empty"),
        (
            lambda c: c.rerank(model="m", query=QUERY, documents=DOCS, top_n=0),
            cohere.UnprocessableEntityError,
            "top_n",
        ),
        (
            lambda c: c.rerank(model="m", query=QUERY, documents=DOCS, top_n=5),
            cohere.UnprocessableEntityError,
            "top_n",
        ),
        (
            lambda c: c.rerank(model="m", query=QUERY, documents=DOCS * 3),
            cohere.UnprocessableEntityError,
            "batch size",
        ),
    ],
)
def test_v2_rerank_errors_are_sdk_exceptions(
    reranker_server: LiveServer, call: object, exception: type[ApiError], needle: str
) -> None:
    with pytest.raises(exception) as info:
        call(v2(reranker_server))  # type: ignore[operator]
    assert needle in info.value.body["message"], info.value.body


def test_v2_embed_errors_are_sdk_exceptions(embedding_server: LiveServer) -> None:
    client = v2(embedding_server)
    with pytest.raises(cohere.UnprocessableEntityError) as info:
        client.embed(model="m", texts=TEXTS, input_type="clustering", embedding_types=["int4"])
    assert "int4" in info.value.body["message"]
    with pytest.raises(cohere.UnprocessableEntityError) as info:
        client.embed(
            model="m",
            texts=TEXTS,
            input_type="clustering",
            embedding_types=["float"],
            output_dimension=4096,
        )
    assert "dimension" in info.value.body["message"]
    with pytest.raises(cohere.UnprocessableEntityError) as info:
        client.embed(model="m", texts=["word " * 400], input_type="clustering", truncate="NONE")
    assert "tokens" in info.value.body["message"] or "long" in info.value.body["message"]
    # The model is an embedder: reranking on it is the wrong kind of model.
    with pytest.raises(ApiError) as api:
        client.rerank(model="m", query=QUERY, documents=DOCS)
    assert api.value.status_code == 424 and "re-ranker" in api.value.body["message"]


def test_v2_rerank_max_tokens_per_doc(reranker_server: LiveServer) -> None:
    long_docs = [d + " It has many other things to say about that." for d in DOCS]
    result = v2(reranker_server).rerank(
        model="m", query=QUERY, documents=long_docs, max_tokens_per_doc=4
    )
    # Scored as TEI scores each document's first four tokens.
    tokens = post(reranker_server, "/tokenize", {"inputs": long_docs, "add_special_tokens": False})
    cut = [
        d.encode()[: t[3]["stop"]].decode() for d, t in zip(long_docs, tokens.json(), strict=True)
    ]
    response = post(reranker_server, "/rerank", {"query": QUERY, "texts": cut})
    expected = {r["index"]: r["score"] for r in response.json()}
    assert {r.index: r.relevance_score for r in result.results} == expected
    assert expected != tei_rerank(reranker_server)
