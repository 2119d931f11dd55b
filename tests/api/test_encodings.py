"""Compact encodings on the real all-MiniLM-L6-v2: parity with sentence-transformers'
`quantize_embeddings` on the same float vectors, and the ranking quality of binary vectors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bench.corpus import corpus
from sentence_transformers.util.quantization import quantize_embeddings

from tests.api.conftest import post
from tests.helpers.server import LiveServer
from vectorpress.api import encodings
from vectorpress.backends.common.calibration import CALIBRATION
from vectorpress.core.calibration import Calibration
from vectorpress.settings import Settings

# Short texts of the benchmark corpus: the parity is per value, and long passages cost minutes.
TEXTS = [t for t in corpus(80, seed=3) if len(t) < 300][:24]


@pytest.fixture(scope="module")
def server(minilm: Path) -> Iterator[LiveServer]:
    with LiveServer(Settings.single(str(minilm))) as srv:
        yield srv


def floats(server: LiveServer, texts: list[str], **extra: Any) -> np.ndarray:
    out = []
    for start in range(0, len(texts), 32):
        response = post(server, "/embed", {"inputs": texts[start : start + 32], **extra})
        assert response.status_code == 200, response.text
        out.extend(response.json())
    return np.array(out, dtype=np.float32)


def calibration_texts() -> list[str]:
    return [t for t in CALIBRATION.read_text(encoding="utf-8").splitlines() if t.strip()]


def cohere_embed(server: LiveServer, kinds: list[str], **extra: Any) -> dict[str, Any]:
    body = {"texts": TEXTS, "input_type": "clustering", "embedding_types": kinds, **extra}
    response = post(server, "/v2/embed", body)
    assert response.status_code == 200, response.text
    return response.json()["embeddings"]


@pytest.mark.parametrize("dimensions", [None, 128])
def test_scalar_quantization_matches_sentence_transformers(
    server: LiveServer, dimensions: int | None
) -> None:
    extra = {} if dimensions is None else {"dimensions": dimensions}
    # The ranges come from the calibration texts' vectors, as the server computes them once.
    calibration = floats(server, calibration_texts(), truncate=True, **extra)
    vectors = floats(server, TEXTS, **extra)
    cohere_extra = {} if dimensions is None else {"output_dimension": dimensions}
    got = cohere_embed(server, ["int8", "uint8", "binary", "ubinary"], **cohere_extra)
    for precision in ("int8", "uint8", "binary", "ubinary"):
        expected = quantize_embeddings(
            vectors, precision=precision, calibration_embeddings=calibration
        )
        np.testing.assert_array_equal(np.array(got[precision]), expected, err_msg=precision)


def test_unnormalized_int8_uses_unnormalized_ranges(server: LiveServer) -> None:
    calibration = floats(server, calibration_texts(), truncate=True, normalize=False)
    vectors = floats(server, TEXTS, normalize=False)
    body = {"input": TEXTS, "encoding_format": "int8", "normalized": False}
    response = post(server, "/v1/embeddings", body)
    assert response.status_code == 200, response.text
    got = np.array([d["embedding"] for d in response.json()["data"]])
    expected = quantize_embeddings(vectors, precision="int8", calibration_embeddings=calibration)
    np.testing.assert_array_equal(got, expected)


def test_encodings_of_odd_widths_and_constant_dimensions() -> None:
    rng = np.random.default_rng(0)
    matrix = rng.standard_normal((5, 13)).astype(np.float32)
    np.testing.assert_array_equal(
        encodings.convert(matrix, "ubinary"), quantize_embeddings(matrix, precision="ubinary")
    )
    calibration = rng.standard_normal((50, 13)).astype(np.float32)
    calibration[:, 4] = 0.5  # a dimension that never varies
    ours = encodings.convert(matrix, "int8", Calibration(calibration), normalize=False)
    expected = quantize_embeddings(matrix, precision="int8", calibration_embeddings=calibration)
    np.testing.assert_array_equal(ours, expected)


def recall_at_10(
    queries: np.ndarray, docs: np.ndarray, q_codes: np.ndarray, d_codes: np.ndarray
) -> float:
    """Mean overlap of the 10 nearest documents by Hamming distance of packed sign bits with the
    10 nearest by float cosine."""
    truth = np.argsort(-(queries @ docs.T), axis=1, kind="stable")[:, :10]
    bits = np.unpackbits(q_codes[:, None, :] ^ d_codes[None, :, :], axis=-1).sum(axis=-1)
    found = np.argsort(bits, axis=1, kind="stable")[:, :10]
    return float(np.mean([len(set(t) & set(f)) / 10 for t, f in zip(truth, found, strict=True)]))


@pytest.mark.slow
def test_binary_hamming_recall_at_10(server: LiveServer) -> None:
    # The benchmark corpus's first 500 texts, each cut to its first 40 words so that the test
    # takes seconds (bench/encoding_sizes.py reports the same on whole texts).
    texts = [" ".join(t.split()[:40]) for t in corpus(500)]
    vectors, codes = [], []
    for start in range(0, len(texts), 32):
        body = {
            "texts": texts[start : start + 32],
            "input_type": "search_document",
            "embedding_types": ["float", "ubinary"],
        }
        response = post(server, "/v2/embed", body)
        assert response.status_code == 200, response.text
        vectors.extend(response.json()["embeddings"]["float"])
        codes.extend(response.json()["embeddings"]["ubinary"])
    docs = np.array(vectors, dtype=np.float32)
    packed = np.array(codes, dtype=np.uint8)
    # The corpus's own first 50 texts as queries, each ranked against all 500.
    recall = recall_at_10(docs[:50], docs, packed[:50], packed)
    print(
        f"binary (ubinary) Hamming recall@10 vs float cosine, 50 queries x 500 docs: {recall:.3f}"
    )
    assert recall > 0.5, recall
