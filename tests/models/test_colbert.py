"""ColBERT models in PyLate's layout, against pylate.models.ColBERT on the same folders.

The folders are made by PyLate itself from tiny BERT and ModernBERT encoders, and the reference
runs there too (.venv-ref, tests/helpers/refvenv.py). The query length is longer than
ModernBERT's local window, so held-out expansion tokens meet the window in one mask.
"""

from __future__ import annotations

import base64
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


def decode(packed: Any, dtype: str) -> np.ndarray:
    """A base64 answer back to an array, from its bytes alone (not the server's encoder)."""
    raw = base64.b64decode(packed["base64"])
    wire = {"float32": "<f4", "float16": "<f2", "bfloat16": "<u2", "binary": "i1"}
    array = np.frombuffer(raw, wire.get(dtype, "u1")).reshape(packed["shape"])
    assert packed["dtype"] == dtype
    return array


def as_float32(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":  # the upper half of a float32
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values.astype(np.float32)


def sign_bits(values: np.ndarray, dtype: str) -> np.ndarray:
    """The unpacked bits of packed sign bytes (binary is each byte shifted by -128)."""
    raw = (values.astype(np.int16) + 128).astype(np.uint8) if dtype == "binary" else values
    return np.unpackbits(raw.astype(np.uint8), axis=-1).astype(bool)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "binary", "ubinary"])
@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_every_encoding_decodes_to_pylate(
    colbert: tuple[LiveServer, dict[str, Any]], dtype: str, encoding_format: str
) -> None:
    srv, want = colbert
    body = {
        "inputs": DOCUMENTS[:2],
        "is_query": False,
        "encoding_format": encoding_format,
        "dtype": dtype,
    }
    r = post(srv, "/embed_multi", body)
    assert r.status_code == 200, r.text
    for n, (item, expected) in enumerate(zip(r.json(), want["documents"][:2], strict=True)):
        reference = np.asarray(expected, dtype=np.float32)
        got = item["colbert"]
        values = decode(got, dtype) if encoding_format == "base64" else np.asarray(got)
        if dtype in ("binary", "ubinary"):
            assert values.shape == (len(reference), reference.shape[1] // 8)
            bits = sign_bits(values, dtype)
            # A sign may differ only where the value is within float32 noise of zero.
            wrong = bits != (reference > 0)
            assert np.all(np.abs(reference[wrong]) < 1e-5), f"document {n}: sign bits"
            assert wrong.sum() < bits.size // 10
            continue
        assert values.shape == reference.shape, f"document {n}: shape"
        decoded = as_float32(values, dtype) if encoding_format == "base64" else values
        # Rounding to 16 bits: half a unit in the last place of each value.
        step = {"float32": 1e-5, "float16": 2**-11, "bfloat16": 2**-8}[dtype]
        error = np.abs(decoded - reference) / np.maximum(np.abs(reference), 2**-14)
        assert error.max() <= step + 1e-4, f"document {n}: {dtype} error {error.max()}"


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_scalar_quantization_is_refused_for_token_vectors(
    colbert: tuple[LiveServer, dict[str, Any]], dtype: str
) -> None:
    srv, _ = colbert
    r = post(srv, "/embed_multi", {"inputs": "a", "dtype": dtype})
    assert r.status_code == 422, r.text
    assert "per-token" in r.json()["error"]
    assert post(srv, "/embed_multi", {"inputs": "a"}).status_code == 200


def test_score_is_maxsim(colbert: tuple[LiveServer, dict[str, Any]]) -> None:
    srv, want = colbert
    r = post(srv, "/score", {"text_1": QUERIES[0], "text_2": DOCUMENTS})
    assert r.status_code == 200, r.text
    for d, item in enumerate(r.json()["data"]):
        assert abs(item["score"] - want["scores"][0][d]) <= 1e-4, f"document {d}"
    r = post(srv, "/score", {"text_1": QUERIES, "text_2": DOCUMENTS[:3]})
    assert r.status_code == 200, r.text
    for q, item in enumerate(r.json()["data"]):
        assert abs(item["score"] - want["scores"][q][q]) <= 1e-4, f"pair {q}"


def test_what_a_colbert_model_refuses(colbert: tuple[LiveServer, dict[str, Any]]) -> None:
    srv, _ = colbert
    long_query = " ".join(["word"] * (QUERY_LENGTH + 5))
    r = post(srv, "/embed_multi", {"inputs": long_query, "is_query": True, "truncate": False})
    assert r.status_code == 422, r.text
    assert "tokens" in r.json()["error"]
    r = post(srv, "/rerank", {"query": long_query, "texts": ["a"], "truncate": False})
    assert r.status_code == 422 and "tokens" in r.json()["error"], r.text
    assert post(srv, "/embed", {"inputs": "a"}).status_code == 424
    assert post(srv, "/embed_multi", {"inputs": "a", "dense": True}).status_code == 424
    r = post(srv, "/rerank", {"query": "q", "texts": ["a"], "weights": [1, 1, 1]})
    assert r.status_code == 422, r.text
    info = httpx.get(f"{srv.url}/info").json()
    assert info["model_type"]["embedding"]["outputs"] == ["colbert"]
    r = post(srv, "/embed_multi", {"inputs": long_query, "is_query": True})
    assert r.status_code == 200 and len(r.json()[0]["colbert"]) == QUERY_LENGTH
    # Per-token vectors are not windowed: asked for, a clear 422.
    for path, body in (
        ("/embed_multi", {"inputs": DOCUMENTS[0], "is_query": False, "windowed": True}),
        ("/rerank", {"query": "q", "texts": ["a"], "windowed": True}),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "max_chunks_per_doc": 2}),
    ):
        r = post(srv, path, body)
        assert r.status_code == 422, (path, r.text)
        assert "windowed" in r.text, (path, r.text)
    # The server kept serving through all of it.
    assert post(srv, "/rerank", {"query": "q", "texts": ["a"]}).status_code == 200
