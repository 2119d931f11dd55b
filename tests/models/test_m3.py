"""bge-m3 served from BAAI's layout, against FlagEmbedding's BGEM3FlagModel on the same folder.

The reference runs in .venv-ref (tests/helpers/refvenv.py): dense and ColBERT vectors, lexical
weights and `compute_score`'s scores, read back as JSON.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.helpers.checkpoints import make_m3, make_tiny
from tests.helpers.reference import assert_close_vectors
from tests.helpers.refvenv import run_reference
from tests.helpers.server import LiveServer
from vectorpress.backends.select import select_backend
from vectorpress.settings import Settings

TEXTS = [
    "What is BGE M3?",
    "BGE M3 is an embedding model supporting dense retrieval, lexical matching and "
    "multi-vector interaction.",
    "the the the cat sat on the mat near the other cat",
    "Definition of BM25",
    "BM25 is a bag-of-words retrieval function that ranks a set of documents based on the "
    "query terms appearing in each document",
    "a",
]
PAIRS = [[TEXTS[0], TEXTS[1]], [TEXTS[0], TEXTS[4]], [TEXTS[3], TEXTS[4]], [TEXTS[3], TEXTS[2]]]
WEIGHTS = [0.4, 0.2, 0.4]


@pytest.fixture(scope="module")
def m3_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_m3(tmp_path_factory.mktemp("m3"))


@pytest.fixture(scope="module")
def reference(m3_folder: Path) -> dict[str, Any]:
    out: dict[str, Any] = run_reference(
        "m3", {"folder": str(m3_folder), "texts": TEXTS, "pairs": PAIRS}
    )
    weighted = run_reference(
        "m3", {"folder": str(m3_folder), "texts": [], "pairs": PAIRS, "weights": WEIGHTS}
    )
    out["weighted_scores"] = weighted["scores"]
    return out


class Counting:
    """The selected backend, counting the batches it runs."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.batches = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def embed(self, batch: Any) -> Any:
        self.batches += 1
        return self.inner.embed(batch)


@pytest.fixture(scope="module")
def m3_server(m3_folder: Path) -> Iterator[tuple[LiveServer, list[Counting]]]:
    made: list[Counting] = []

    def factory(spec: Any, settings: Any) -> Any:
        made.append(Counting(select_backend(spec, settings)))
        return made[-1]

    with LiveServer(Settings.single(str(m3_folder)), make_backend=factory) as srv:
        yield srv, made


def post(server: LiveServer, path: str, payload: Any) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=payload, timeout=60)


def test_dense_sparse_colbert_from_one_pass(
    m3_server: tuple[LiveServer, list[Counting]], reference: dict[str, Any]
) -> None:
    srv, (backend,) = m3_server
    before = backend.batches
    r = post(srv, "/embed_multi", {"inputs": TEXTS[1], "dense": True, "sparse": True})
    assert r.status_code == 200, r.text
    assert backend.batches == before + 1, "the three outputs took more than one forward pass"
    (item,) = r.json()
    assert set(item) == {"dense", "sparse", "colbert"}
    assert_close_vectors([item["dense"]], [reference["dense"][1]], max_abs=1e-5, what="dense")


def test_every_output_matches_flagembedding(
    m3_server: tuple[LiveServer, list[Counting]], reference: dict[str, Any]
) -> None:
    srv, _ = m3_server
    body = {"inputs": TEXTS, "dense": True, "sparse": True, "colbert": True}
    r = post(srv, "/embed_multi", body)
    assert r.status_code == 200, r.text
    items = r.json()
    dense = [i["dense"] for i in items]
    assert_close_vectors(dense, reference["dense"], max_abs=1e-5, what="dense")
    for n, (item, want_vecs) in enumerate(zip(items, reference["colbert"], strict=True)):
        assert len(item["colbert"]) == len(want_vecs), f"text {n}: token count"
        assert_close_vectors(item["colbert"], want_vecs, max_abs=1e-5, what=f"colbert[{n}]")
    for n, (item, want) in enumerate(zip(items, reference["sparse"], strict=True)):
        got = {str(p["index"]): p["value"] for p in item["sparse"]}
        assert got.keys() == want.keys(), f"text {n}: token ids {sorted(got)} != {sorted(want)}"
        for token, value in want.items():
            assert abs(got[token] - value) <= 1e-5, f"text {n}, token {token}"


def test_embed_and_embed_sparse_routes(
    m3_server: tuple[LiveServer, list[Counting]], reference: dict[str, Any]
) -> None:
    srv, _ = m3_server
    r = post(srv, "/embed", {"inputs": TEXTS})
    assert r.status_code == 200, r.text
    assert_close_vectors(r.json(), reference["dense"], max_abs=1e-5, what="/embed")
    r = post(srv, "/embed_sparse", {"inputs": TEXTS})
    assert r.status_code == 200, r.text
    for item, want in zip(r.json(), reference["sparse"], strict=True):
        got = {str(p["index"]): p["value"] for p in item}
        assert got.keys() == want.keys()
        assert max(abs(got[k] - v) for k, v in want.items()) <= 1e-5


@pytest.mark.parametrize("weights", [None, WEIGHTS])
def test_rerank_is_compute_score(
    m3_server: tuple[LiveServer, list[Counting]],
    reference: dict[str, Any],
    weights: list[float] | None,
) -> None:
    srv, _ = m3_server
    want = reference["scores"] if weights is None else reference["weighted_scores"]
    for query in {q for q, _ in PAIRS}:
        texts = [p for q, p in PAIRS if q == query]
        expected = [
            w["colbert+sparse+dense"] for (q, _), w in zip(PAIRS, want, strict=True) if q == query
        ]
        body: dict[str, Any] = {"query": query, "texts": texts}
        if weights is not None:
            body["weights"] = weights
        r = post(srv, "/rerank", body)
        assert r.status_code == 200, r.text
        got = {hit["index"]: hit["score"] for hit in r.json()}
        for i, score in enumerate(expected):
            assert abs(got[i] - score) <= 1e-5, f"{query!r} / text {i}: {got[i]} != {score}"


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_base64_dense_and_colbert(
    m3_server: tuple[LiveServer, list[Counting]], reference: dict[str, Any], dtype: str
) -> None:
    srv, _ = m3_server
    body = {"inputs": [TEXTS[1]], "encoding_format": "base64", "dtype": dtype, "dense": True}
    r = post(srv, "/embed_multi", body)
    assert r.status_code == 200, r.text
    (item,) = r.json()
    wire = {"float32": "<f4", "float16": "<f2", "bfloat16": "<u2"}[dtype]
    for name, want in (("dense", reference["dense"][1]), ("colbert", reference["colbert"][1])):
        packed = item[name]
        assert packed["dtype"] == dtype
        array = np.frombuffer(base64.b64decode(packed["base64"]), wire).reshape(packed["shape"])
        if dtype == "bfloat16":  # the upper half of a float32
            array = (array.astype(np.uint32) << 16).view(np.float32)
        vectors = array if name == "colbert" else array[None]
        want_vectors = want if name == "colbert" else [want]
        assert_close_vectors(vectors, want_vectors, min_cos=0.9999, what=f"{dtype} {name}")


@pytest.mark.parametrize("dtype", ["int8", "uint8", "binary", "ubinary"])
def test_compact_dense_is_the_dialects(
    m3_server: tuple[LiveServer, list[Counting]], dtype: str
) -> None:
    """A dense vector's compact encodings equal those /v1/embeddings gives the same text
    (its calibrated int8/uint8 ranges, its sign bits); per-token vectors have no int8 ranges."""
    srv, _ = m3_server
    r = post(
        srv, "/embed_multi", {"inputs": TEXTS[:2], "dense": True, "colbert": False, "dtype": dtype}
    )
    assert r.status_code == 200, r.text
    r2 = post(srv, "/v1/embeddings", {"input": TEXTS[:2], "encoding_format": dtype})
    assert r2.status_code == 200, r2.text
    for item, data in zip(r.json(), r2.json()["data"], strict=True):
        assert item["dense"] == data["embedding"]
    if dtype in ("int8", "uint8"):
        r = post(srv, "/embed_multi", {"inputs": "a", "dense": True, "dtype": dtype})
        assert r.status_code == 422 and "per-token" in r.json()["error"], r.text


def test_score_is_compute_score(
    m3_server: tuple[LiveServer, list[Counting]], reference: dict[str, Any]
) -> None:
    srv, _ = m3_server
    body = {"text_1": [q for q, _ in PAIRS], "text_2": [p for _, p in PAIRS]}
    r = post(srv, "/score", body)
    assert r.status_code == 200, r.text
    for n, (item, want) in enumerate(zip(r.json()["data"], reference["scores"], strict=True)):
        score = want["colbert+sparse+dense"]
        assert abs(item["score"] - score) <= 1e-5, f"pair {n}: {item['score']} != {score}"


def test_long_inputs_and_windows(m3_server: tuple[LiveServer, list[Counting]]) -> None:
    srv, _ = m3_server
    # Per-token outputs are never windowed; the dense route is.
    r = post(srv, "/embed_multi", {"inputs": TEXTS[1], "windowed": True})
    assert r.status_code == 422 and "windowed" in r.json()["error"], r.text
    r = post(srv, "/rerank", {"query": "q", "texts": ["a"], "windowed": True})
    assert r.status_code == 422, r.text
    r = post(srv, "/embed", {"inputs": TEXTS[1], "windowed": True})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "weights",
    [
        [1.0, -1.0, 1.0],
        [0.0, 0.0, 0.0],
        [1.0, 1.0],
        ["x", 1, 1],
        [1e308, 1e308, 1e308],  # each finite, their sum not: every score would be NaN
        [1.0, 1.0, 1.0, 1.0],
        "NaN",
    ],
)
def test_bad_weights_are_refused(
    m3_server: tuple[LiveServer, list[Counting]], weights: list[Any]
) -> None:
    srv, _ = m3_server
    r = post(srv, "/rerank", {"query": "q", "texts": ["a"], "weights": weights})
    assert r.status_code == 422, r.text
    assert post(srv, "/rerank", {"query": "q", "texts": ["a"]}).status_code == 200


def test_nothing_asked_is_refused(m3_server: tuple[LiveServer, list[Counting]]) -> None:
    srv, _ = m3_server
    r = post(srv, "/embed_multi", {"inputs": "a", "colbert": False})
    assert r.status_code == 422, r.text


def test_info_lists_the_outputs(m3_server: tuple[LiveServer, list[Counting]]) -> None:
    srv, _ = m3_server
    info = httpx.get(f"{srv.url}/info").json()
    assert info["model_type"]["embedding"]["outputs"] == ["dense", "sparse", "colbert"]


def test_a_dense_model_has_no_multi_vectors(tmp_path: Path) -> None:
    folder = make_tiny(tmp_path / "bert", "bert")
    with LiveServer(Settings.single(str(folder))) as srv:
        r = post(srv, "/embed_multi", {"inputs": "a"})
        assert r.status_code == 424, r.text
        r = post(srv, "/rerank", {"query": "q", "texts": ["a"], "weights": [1, 1, 1]})
        assert r.status_code == 422, r.text
        assert post(srv, "/embed", {"inputs": "a"}).status_code == 200
