"""ONNX Runtime's transformer fusions on an exported BERT graph (backends/onnx/fuse.py): the torch
backend's short passes run the fused graph, with sentence-transformers' vectors; a fusion that
moves the hidden states, or one the optimizer gives up on, leaves the exported graph in use (and
is not tried again); other encoders, wider ones and `--backend onnx` keep the exported graph."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from tests.helpers.reference import assert_close_vectors, st_encode
from tests.helpers.texts import mixed_texts
from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.onnx import fuse
from vectorpress.backends.onnx.backend import OnnxBackend
from vectorpress.backends.onnx.export import cached_graph
from vectorpress.backends.onnx.fuse import NOT_FUSED, fused_graph, fused_key
from vectorpress.backends.torch.short_graph import ShortGraph, graph_candidate
from vectorpress.model_spec import ModelSpec, load_model_spec
from vectorpress.settings import ModelSettings
from vectorpress.types import Batch, Encoding

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def graphs(minilm: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A graph cache holding MiniLM's exported graph (exported once for these tests)."""
    cache = tmp_path_factory.mktemp("graphs")
    cached_graph(minilm, "embedding", cache)
    return cache


def _spec(folder: Path) -> ModelSpec:
    return load_model_spec(folder, ModelSettings(str(folder)))


def _ops(graph: Path) -> Counter[str]:
    return Counter(node.op_type for node in onnx.load(str(graph)).graph.node)


def _batch(folder: Path, texts: list[str]) -> Batch:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(256)
    return Batch.from_encodings(
        [Encoding(ids=e.ids, type_ids=e.type_ids) for e in tok.encode_batch(texts)]
    )


def _mean_pooled(graph: ShortGraph, batch: Batch) -> np.ndarray:
    """The graph's states of `batch`'s texts (packed, as the torch backend hands them over),
    mean-pooled and normalized, as all-MiniLM-L6-v2's sentence-transformers modules do."""
    import torch

    seqs = PackedSequences(torch.from_numpy(batch.cu_seqlens), batch.max_seqlen)
    inputs = [
        torch.from_numpy(a) for a in (batch.input_ids, batch.token_type_ids, batch.position_ids)
    ]
    states = graph(*inputs, seqs).numpy()
    bounds = batch.cu_seqlens
    vectors = np.stack([states[a:b].mean(axis=0) for a, b in itertools.pairwise(bounds)])
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_minilm_short_passes_run_on_the_fused_graph(minilm: Path, graphs: Path) -> None:
    spec = _spec(minilm)
    exported = cached_graph(minilm, "embedding", graphs)
    graph = graph_candidate(spec, 0, graphs)
    assert graph is not None
    fused = graphs / fused_key(exported) / "model.onnx"
    assert graph.session._model_path == str(fused)
    ops = _ops(fused)
    assert ops["Attention"] == ops["BiasGelu"] == 6, ops
    assert ops["SkipLayerNormalization"] == 12 and ops["EmbedLayerNormalization"] == 1, ops
    assert "Softmax" not in ops and "LayerNormalization" not in ops, ops
    # Texts of mixed lengths pad inside the fused attention: each keeps its vector, alone or
    # in a pass with others, and it is sentence-transformers' one.
    texts = mixed_texts(12, seed=21)
    together = _mean_pooled(graph, _batch(minilm, texts))
    alone = np.concatenate([_mean_pooled(graph, _batch(minilm, [t])) for t in texts[:4]])
    want = st_encode(minilm, texts)
    assert_close_vectors(together, want, min_cos=0.999999, max_abs=1e-6)
    assert_close_vectors(alone, want[:4], min_cos=0.999999, max_abs=1e-6)
    # `--backend onnx` keeps the exported graph: its bulk passes gained nothing.
    assert OnnxBackend(spec, "cpu", "float32", cache_dir=graphs).path == exported


def test_a_fusion_that_moves_the_states_is_not_used_nor_tried_again(
    minilm: Path, graphs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _spec(minilm)
    exported = cached_graph(minilm, "embedding", graphs)
    # The fused kernels sum in another order: no difference at all is asked here.
    assert fused_graph(exported, spec, tmp_path, tolerance=0.0) == exported
    marker = tmp_path / f"{fused_key(exported)}.{NOT_FUSED}"
    assert "differ by up to" in marker.read_text()
    assert not (tmp_path / fused_key(exported)).exists()
    assert not list(tmp_path.glob("*.partial-*"))

    def no_fusion(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("fused again")

    monkeypatch.setattr(fuse, "fuse_graph", no_fusion)
    assert fused_graph(exported, spec, tmp_path) == exported


def test_a_graph_the_optimizer_gives_up_on_is_used_unfused(
    minilm: Path, graphs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _spec(minilm)
    exported = cached_graph(minilm, "embedding", graphs)
    # Told a head count that does not divide the width, the optimizer gives up.
    monkeypatch.setitem(spec.config, "num_attention_heads", 5)
    assert fused_graph(exported, spec, tmp_path) == exported
    marker = tmp_path / f"{fused_key(exported)}.{NOT_FUSED}"
    assert "the optimizer failed" in marker.read_text()


@pytest.mark.parametrize("widest", [32, 31])
def test_only_encoders_up_to_the_fused_width_get_the_fused_graph(
    tiny_bert_family: Callable[..., Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    widest: int,
) -> None:
    # A BERT-base-wide encoder's short passes ran level or slower fused: the tiny BERT (32
    # wide) stands for it once the widest fused width is set below its own.
    folder = tiny_bert_family("bert", "embedding")
    monkeypatch.setattr(fuse, "MAX_FUSED_WIDTH", widest)
    graph = graph_candidate(_spec(folder), 0, tmp_path)
    assert graph is not None
    exported = cached_graph(folder, "embedding", tmp_path)
    fused = tmp_path / fused_key(exported) / "model.onnx"
    assert graph.session._model_path == str(fused if widest == 32 else exported)
    assert _ops(Path(graph.session._model_path))["Attention"] == (2 if widest == 32 else 0)


def test_other_encoders_keep_their_exported_graph(
    tiny_bert_family: Callable[..., Path], tmp_path: Path
) -> None:
    folder = tiny_bert_family("distilbert", "embedding")
    graph = graph_candidate(_spec(folder), 0, tmp_path)
    assert graph is not None
    assert graph.session._model_path == str(cached_graph(folder, "embedding", tmp_path))
    assert not list(tmp_path.glob("fused-*"))
