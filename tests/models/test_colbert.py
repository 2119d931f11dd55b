"""ColBERT models in PyLate's layout, against pylate.models.ColBERT on the same folders.

The folders are made by PyLate itself from tiny BERT and ModernBERT encoders, and the reference
runs there too (.venv-ref, tests/helpers/refvenv.py). The query length is longer than
ModernBERT's local window, so held-out expansion tokens meet the window in one mask.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from tests.helpers.checkpoints import make_colbert
from tests.helpers.reference import assert_close_vectors
from tests.helpers.refvenv import run_reference
from tests.helpers.server import LiveServer
from vectorpress.settings import Settings

QUERY_LENGTH, DOCUMENT_LENGTH = 20, 40
QUERIES = [
    "what is late interaction?",
    "a",
    "how do ColBERT models score documents against a query, token by token, in retrieval?",
]
DOCUMENTS = [
    "ColBERT encodes queries and documents into per-token vectors; MaxSim sums the best "
    "match of each query token.",
    "the cat sat on the mat!!",
    "Late interaction: fine-grained, yet documents can be indexed offline (ahead of time).",
    "x",
]


@pytest.fixture(scope="module", params=["bert", "modernbert"])
def colbert(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LiveServer, dict[str, Any]]]:
    folder = make_colbert(
        tmp_path_factory.mktemp("colbert") / request.param,
        request.param,
        query_length=QUERY_LENGTH,
        document_length=DOCUMENT_LENGTH,
    )
    want = run_reference(
        "colbert", {"folder": str(folder), "queries": QUERIES, "documents": DOCUMENTS}
    )
    with LiveServer(Settings.single(str(folder), max_client_batch_size=8)) as srv:
        yield srv, want


def post(server: LiveServer, path: str, payload: Any) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=payload, timeout=60)


@pytest.mark.parametrize("side", ["queries", "documents"])
def test_token_vectors_match_pylate(colbert: tuple[LiveServer, dict[str, Any]], side: str) -> None:
    srv, want = colbert
    texts = QUERIES if side == "queries" else DOCUMENTS
    r = post(srv, "/embed_multi", {"inputs": texts, "is_query": side == "queries"})
    assert r.status_code == 200, r.text
    for n, (item, expected) in enumerate(zip(r.json(), want[side], strict=True)):
        assert len(item["colbert"]) == len(expected), f"{side}[{n}]: token count"
        if side == "queries":
            assert len(expected) == QUERY_LENGTH
        assert_close_vectors(item["colbert"], expected, max_abs=1e-5, what=f"{side}[{n}]")


def test_one_text_alone_equals_it_in_a_batch(colbert: tuple[LiveServer, dict[str, Any]]) -> None:
    srv, want = colbert
    r = post(srv, "/embed_multi", {"inputs": QUERIES[1], "is_query": True})
    assert r.status_code == 200, r.text
    assert_close_vectors(r.json()[0]["colbert"], want["queries"][1], max_abs=1e-5, what="alone")


def test_rerank_by_maxsim(colbert: tuple[LiveServer, dict[str, Any]]) -> None:
    srv, want = colbert
    for q, query in enumerate(QUERIES):
        r = post(srv, "/rerank", {"query": query, "texts": DOCUMENTS})
        assert r.status_code == 200, r.text
        hits = r.json()
        got = {hit["index"]: hit["score"] for hit in hits}
        for d, score in enumerate(want["scores"][q]):
            assert abs(got[d] - score) <= 1e-4, f"query {q}, document {d}: {got[d]} != {score}"
        expected_order = sorted(range(len(DOCUMENTS)), key=lambda d: -want["scores"][q][d])
        assert [hit["index"] for hit in hits] == expected_order


def test_float16_base64(colbert: tuple[LiveServer, dict[str, Any]]) -> None:
    import base64

    srv, want = colbert
    body = {"inputs": [DOCUMENTS[0]], "is_query": False, "encoding_format": "base64"}
    r = post(srv, "/embed_multi", {**body, "dtype": "float16"})
    assert r.status_code == 200, r.text
    packed = r.json()[0]["colbert"]
    array = np.frombuffer(base64.b64decode(packed["base64"]), "<f2").reshape(packed["shape"])
    assert_close_vectors(array, want["documents"][0], min_cos=0.999, what="float16")


def test_what_a_colbert_model_refuses(colbert: tuple[LiveServer, dict[str, Any]]) -> None:
    srv, _ = colbert
    long_query = " ".join(["word"] * (QUERY_LENGTH + 5))
    r = post(srv, "/embed_multi", {"inputs": long_query, "is_query": True, "truncate": False})
    assert r.status_code == 422, r.text
    assert "tokens" in r.json()["error"]
    assert post(srv, "/embed", {"inputs": "a"}).status_code == 424
    assert post(srv, "/embed_multi", {"inputs": "a", "dense": True}).status_code == 424
    r = post(srv, "/rerank", {"query": "q", "texts": ["a"], "weights": [1, 1, 1]})
    assert r.status_code == 422, r.text
    info = httpx.get(f"{srv.url}/info").json()
    assert info["model_type"]["embedding"]["outputs"] == ["colbert"]
    r = post(srv, "/embed_multi", {"inputs": long_query, "is_query": True})
    assert r.status_code == 200 and len(r.json()[0]["colbert"]) == QUERY_LENGTH
