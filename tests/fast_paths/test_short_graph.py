"""Short CPU passes of the torch backend on the encoder's exported ONNX graph
(backends/torch/short_graph.py): the vectors sentence-transformers gives, the routing of each
pass, the start-up plan that chooses it, and a start that cannot have the graph."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers.cpu import needs_onednn
from tests.helpers.passes import timed_shortcuts
from tests.helpers.reference import assert_close_vectors, st_encode
from tests.helpers.texts import mixed_texts
from vectorpress.backends.common.cache import build_cache
from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.torch.backend import TorchBackend
from vectorpress.backends.torch.passes import (
    GRAPH,
    SMALL_PASS_TOKENS,
    CpuPasses,
    PassPlan,
    Shortcut,
    plan_passes,
)
from vectorpress.backends.torch.short_graph import MAX_PARAMETERS, ShortGraph, graph_candidate
from vectorpress.model_spec import ModelSpec, load_model_spec
from vectorpress.settings import ModelSettings
from vectorpress.types import Batch, Encoding

pytest.importorskip("onnxruntime")

ON_GRAPH = PassPlan(small_onednn=False, large_onednn=False, small_threads=1, small_shortcut=GRAPH)


def _spec(folder: Path) -> ModelSpec:
    return load_model_spec(folder, ModelSettings(str(folder)))


def _encodings(folder: Path, texts: list[str]) -> list[Encoding]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(256)
    return [Encoding(ids=e.ids, type_ids=e.type_ids) for e in tok.encode_batch(texts)]


def _graph(spec: ModelSpec) -> ShortGraph:
    # The hub cache's graph, as a server's start-up keeps it: exported once per session.
    graph = graph_candidate(spec, 0, build_cache())
    assert graph is not None
    return graph


def _counted(graph: ShortGraph) -> list[tuple[int, ...]]:
    """The padded input shapes of every graph run from now on."""
    shapes: list[tuple[int, ...]] = []
    run = graph.session.run

    class Session:
        def run(self, names: Any, feeds: dict[str, np.ndarray]) -> Any:
            shapes.append(feeds["input_ids"].shape)
            return run(names, feeds)

    graph.session = Session()
    return shapes


def test_short_passes_on_the_graph_give_sentence_transformers_vectors(minilm: Path) -> None:
    spec = _spec(minilm)
    backend = TorchBackend(spec, "cpu", "float32")
    graph = _graph(spec)
    backend.passes = CpuPasses(plan=ON_GRAPH, shortcut=graph)
    runs = _counted(graph)
    queries = ["where is the nearest train station", "a", "how do I reset my password today?"]
    longer = mixed_texts(12, seed=5)
    alone = [backend.embed(Batch.from_encodings(_encodings(minilm, [q]))).pooled for q in queries]
    # Two queries of different lengths in one pass: padded in the graph, unpadded after.
    pair = backend.embed(Batch.from_encodings(_encodings(minilm, queries[:2]))).pooled
    assert [shape[0] for shape in runs] == [1, 1, 1, 2], runs
    runs.clear()
    # A batch of SMALL_PASS_TOKENS tokens or more runs on the native model.
    encodings = _encodings(minilm, longer)
    assert sum(len(e) for e in encodings) >= SMALL_PASS_TOKENS
    batched = backend.embed(Batch.from_encodings(encodings)).pooled
    assert runs == []
    assert pair is not None and batched is not None
    # sentence-transformers' all-MiniLM-L6-v2 ends in a Normalize module.
    want = st_encode(minilm, [*queries, *longer])
    got = np.stack([v[0] for v in alone if v is not None] + list(pair) + list(batched))
    got /= np.linalg.norm(got, axis=1, keepdims=True)
    assert_close_vectors(got, [*want[:3], *want[:2], *want[3:]], min_cos=0.999999, max_abs=1e-6)


def test_the_graph_unpads_every_sequence_into_the_packed_rows(minilm: Path) -> None:
    spec = _spec(minilm)
    backend = TorchBackend(spec, "cpu", "float32")
    graph = _graph(spec)
    encodings = _encodings(minilm, ["one", "two words here", "and a third, longer sequence"])
    batch = Batch.from_encodings(encodings)
    seqs = PackedSequences(torch.from_numpy(batch.cu_seqlens), batch.max_seqlen)
    inputs = [
        torch.from_numpy(a) for a in (batch.input_ids, batch.token_type_ids, batch.position_ids)
    ]
    with torch.inference_mode():
        native = backend.model.encoder(*inputs, seqs)
        got = graph(*inputs, seqs)
    assert got.shape == native.shape
    assert float((got - native).abs().max()) < 1e-5


def test_a_query_with_held_out_keys_and_larger_passes_stay_native() -> None:
    called: list[str] = []

    def encoder(ids: torch.Tensor, *_: Any) -> torch.Tensor:
        called.append("native")
        return torch.zeros(len(ids), 4)

    def graph(ids: torch.Tensor, *_: Any) -> torch.Tensor:
        called.append("graph")
        return torch.zeros(len(ids), 4)

    passes = CpuPasses(plan=ON_GRAPH, shortcut=graph)

    def run(lengths: list[int], keys: list[int] | None = None) -> list[str]:
        called.clear()
        cu = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32)
        ids = torch.zeros(sum(lengths), dtype=torch.long)
        passes.run(encoder, ids, ids, ids, PackedSequences(cu, max(lengths), key_lengths=keys))
        return called

    assert run([5, 9]) == ["graph"]
    assert run([5], keys=[3]) == ["native"]  # a ColBERT query's expansion held out
    assert run([40, 30]) == ["native"]
    # A plan that did not choose the graph never runs it.
    assert CpuPasses(plan=PassPlan(False, False), shortcut=graph).shortcut is None


@needs_onednn
def test_the_plan_takes_the_graph_only_where_it_was_timed_faster(minilm: Path) -> None:
    spec = _spec(minilm)
    encoder = TorchBackend(spec, "cpu", "float32").model.encoder

    instant, slow = timed_shortcuts(384)

    def on(graph: Any) -> tuple[Shortcut, ...]:
        return (Shortcut(GRAPH, graph, (1,)),)

    fast = plan_passes(encoder, spec.position_offset, shortcuts=on(instant))
    assert fast.small_shortcut == GRAPH and fast.small_threads == 1
    assert not plan_passes(encoder, spec.position_offset, shortcuts=on(slow)).small_shortcut
    assert not plan_passes(encoder, spec.position_offset).small_shortcut


def test_a_start_without_the_graph_serves_on_the_native_model(
    minilm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    spec = _spec(minilm)
    # A cache where no folder can be made: the export cannot even begin.
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with caplog.at_level(logging.WARNING):
        assert graph_candidate(spec, 0, blocked) is None
    assert "short passes stay native" in caplog.text
    assert graph_candidate(spec, MAX_PARAMETERS + 1, build_cache()) is None
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    assert graph_candidate(spec, 0, build_cache()) is None

    backend = TorchBackend(spec, "cpu", "float32", cache_dir=blocked)
    assert backend.passes.shortcut is None
    query = backend.embed(Batch.from_encodings(_encodings(minilm, ["a short query"]))).pooled
    assert query is not None
    query /= np.linalg.norm(query, axis=1, keepdims=True)
    assert_close_vectors(query, st_encode(minilm, ["a short query"]), max_abs=1e-6)
