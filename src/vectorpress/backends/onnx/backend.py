"""OnnxBackend: a model's ONNX graph, run by ONNX Runtime on length-bucketed batches.

The graph is the checkpoint's own `model.onnx`, or one exported from its weights on the first
start and cached (`export.cached_graph`); with `--dtype int8`, that graph with its linear layers
quantized (`quantize.py`), also built once and cached.

The graph takes padded `(batch, length)` inputs. Padding a whole batch to its longest input
wastes most of the work on mixed lengths (a batch of 32 in arrival order carries about 2.5x
its real tokens), so each batch is sorted by length and cut into buckets whose padded cost,
plus a fixed per-call cost, is the least (`buckets`). The hidden states come back unpadded
into the packed layout, so pooling, Dense modules and raw outputs are `backends/common`'s.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vectorpress.backends.common.buckets import buckets, padded_inputs
from vectorpress.backends.common.cache import build_cache
from vectorpress.backends.common.dense import load_dense
from vectorpress.backends.common.multivector import MultiVectorHeads
from vectorpress.backends.common.pooling import (
    pool,
    splade_block_rows,
    splade_from_logits,
    splade_vectors,
)
from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.common.threads import num_threads
from vectorpress.backends.torch.backend import load_head
from vectorpress.backends.torch.heads import MLMHead
from vectorpress.backends.torch.registry import lookup
from vectorpress.cpus import available_cpus
from vectorpress.errors import StartupError
from vectorpress.model_spec import ModelSpec
from vectorpress.types import Batch, BatchOutput

log = logging.getLogger(__name__)

ONNX_FILES = ("model.onnx", "onnx/model.onnx")

# Padded tokens per graph run at most. ONNX Runtime's CPU arena keeps the largest working set
# it has met (attention alone is rows x heads x length^2 floats), so an unbounded bucket of a
# 16,384-token batch left all-MiniLM-L6-v2's process at 1,032 MiB resident after the work,
# against 614 MiB with passes of 4,096 tokens and 498 with 2,048, at the same throughput
# (600 corpus texts in arrival-order batches, three runs each).
PASS_TOKENS = 2048
# Scores per graph run at most for a graph that gives every token's vocabulary scores (a SPLADE
# graph ending in the masked-LM head): 512 padded tokens of a 30,522-token vocabulary, 62 MB.
LOGITS_PASS_SCORES = 512 * 30522


def find_onnx_file(folder: Path) -> Path | None:
    return next((folder / n for n in ONNX_FILES if (folder / n).is_file()), None)


def check_expansion_window(spec: ModelSpec) -> None:
    """Refuse a ColBERT model whose held-out query expansion reaches past its encoder's local
    attention window (ModernBERT's `local_attention`).

    A token of a sliding-window layer attends to the keys within half a window of it; an
    expansion token further than that from the query's last real token has no key left (the
    others are held out), and such a row comes out of the exported graph's padded eager
    attention differently from the reference's (and the native backend's): it cannot be
    served alike, so it is not served at all."""
    colbert = spec.colbert
    if colbert is None or not colbert.expansion or colbert.attend_to_expansion:
        return
    window = spec.config.get("local_attention")
    half = int(window) // 2 if window else int(spec.config.get("sliding_window") or 0)
    # The shortest query holds 3 real tokens (CLS, the prefix, SEP).
    if half and colbert.query_length - 1 >= 3 + half:
        raise StartupError(
            f"--backend onnx cannot serve this ColBERT model: its query length "
            f"{colbert.query_length} reaches past the encoder's local attention window (half "
            f"{half}), where held-out expansion tokens see no real token; serve it with "
            "--backend torch"
        )


def onnx_graph(spec: ModelSpec, cache_dir: Path) -> Path:
    """The checkpoint's own graph, or one exported from its weights (once, then cached)."""
    shipped = find_onnx_file(spec.path)
    if shipped is not None:
        return shipped
    from vectorpress.backends.onnx.export import cached_graph

    # An LLM reranker's graph is its decoder's hidden states: the answer head runs here.
    kind = "embedding" if spec.kind == "embedding" or spec.llm_rerank else "classifier"
    if spec.is_splade and not native_mlm_head(spec):
        kind = "mlm"  # the graph ends in the head's scores; else the head runs in torch
    return cached_graph(spec.path, kind, cache_dir)


def native_mlm_head(spec: ModelSpec) -> bool:
    arch = lookup(spec.model_type)
    return arch is not None and arch.mlm is not None


def int8_graph(graph: Path, spec: ModelSpec, cache_dir: Path) -> Path:
    """`graph` with its linear layers in int8 (`quantize.py`), built once and cached."""
    from vectorpress.backends.common.calibration import CALIBRATION, calibration_batch
    from vectorpress.backends.onnx.export import build_once
    from vectorpress.backends.onnx.quantize import Report, int8_key, quantize_graph

    def build(out: Path) -> None:
        log.info("quantizing %s to int8 once, into %s", graph, out.parent.parent)
        batch = calibration_batch(spec)
        quantize_graph(graph, out, [padded_inputs(batch, [i]) for i in range(batch.size)])

    int8 = build_once(
        cache_dir / int8_key(graph, CALIBRATION),
        build,
        f"cannot quantize {graph} to int8",
        "serve it without --dtype int8",
    )
    log.info("int8 graph %s: %s", int8, Report.load(int8.parent) or "no quantize.json")
    return int8


def session_options() -> Any:
    """ONNX Runtime's options for every graph served here: all graph optimizations, one
    intra-op thread per CPU the process may use, no inter-op pool."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = available_cpus()
    options.inter_op_num_threads = 1
    return options


class OnnxBackend:
    """Runs an ONNX encoder graph (fp32 or quantized) through ONNX Runtime."""

    name = "onnx"
    # Buckets keep the padded cost near the real token count, so the queue budgets real
    # tokens as it does for the packed torch backend.
    is_padded = False
    max_batch_size: int | None = None
    concurrent_passes = False
    pass_tokens = PASS_TOKENS

    def __init__(
        self,
        spec: ModelSpec,
        device: str = "cpu",
        dtype: str | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        """The signature every backend shares (see `backends.base.Backend`). `device` "auto"
        takes CUDA where this onnxruntime build has its provider; graphs exported or quantized
        here are kept under `cache_dir` (`common.cache.build_cache()` when not given)."""
        cache_dir = cache_dir or build_cache()
        try:
            import onnxruntime as ort
        except ImportError:
            raise StartupError(
                "--backend onnx needs onnxruntime: pip install 'vectorpress[onnx]'"
            ) from None
        if dtype not in (None, "float32", "int8"):
            raise StartupError(
                f"--backend onnx runs the graph's own precision, or int8 with --dtype int8; "
                f"--dtype {dtype} cannot apply"
            )
        int8 = dtype == "int8"
        if int8 and device == "cuda":
            raise StartupError("--dtype int8 runs on the CPU only")
        self.spec = spec
        check_expansion_window(spec)
        self.path = onnx_graph(spec, cache_dir)
        self.dtype = "float32"
        options = session_options()
        providers = ["CPUExecutionProvider"]
        self.device = "cpu"
        if device == "cuda" or (
            device == "auto"
            and not int8
            and "CUDAExecutionProvider" in ort.get_available_providers()
        ):
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise StartupError("--device cuda: this onnxruntime build has no CUDA provider")
            providers.insert(0, "CUDAExecutionProvider")
            self.device = "cuda"
        if int8:
            self.path = int8_graph(self.path, spec, cache_dir)
            self.dtype = "int8"
        try:
            self.session = ort.InferenceSession(str(self.path), options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own exception types
            raise StartupError(f"cannot load {self.path}: {exc}") from exc
        self._heads(
            {i.name for i in self.session.get_inputs()},
            {o.name: o.shape for o in self.session.get_outputs()},
        )
        log.info("onnx graph %s, providers %s", self.path, self.session.get_providers())

    def _heads(self, inputs: set[str], outputs: dict[str, Any]) -> None:
        """Check the graph's inputs, pick its output and set up what runs after it (Dense
        modules, a masked-LM head for SPLADE): `outputs` maps each output's name to its shape."""
        spec = self.spec
        self.inputs = inputs
        missing = {"input_ids", "attention_mask"} - inputs
        if missing:
            raise StartupError(f"{self.path} lacks the inputs {sorted(missing)}")
        want: tuple[str, ...]
        if spec.kind == "embedding" or spec.llm_rerank is not None:
            want = ("last_hidden_state", "token_embeddings")
            # A SPLADE graph as exporters write one: the masked-LM head's scores per token.
            want += ("logits",) if spec.is_splade else ()
        else:
            want = ("logits",)
        self.output = next((name for name in want if name in outputs), None)
        if self.output is None:
            raise StartupError(f"{self.path} has none of the outputs {list(want)}: {list(outputs)}")
        self.dense = [load_dense(d).eval() for d in spec.dense]
        # The heads that read every token's hidden state (bge-m3's, ColBERT's projection) and
        # an LLM reranker's one-row answer head run in torch, as the native backend's do.
        self.multi = MultiVectorHeads(spec)
        self.answer = load_head(spec).eval() if spec.llm_rerank is not None else None
        self.mlm_head: MLMHead | None = None
        if spec.is_splade and self.output != "logits":
            if not native_mlm_head(spec):
                raise StartupError(
                    f"{self.path} gives hidden states, and {spec.model_type} has no native "
                    "masked-LM head for SPLADE: give a graph whose output is its logits"
                )
            # The graph stops at the hidden states (as `export` writes it): the head runs here,
            # in blocks of tokens, so a batch's tokens x vocabulary never exists at once.
            head = load_head(spec)
            assert isinstance(head, MLMHead)
            head.eval().fuse()
            self.mlm_head = head
        elif spec.is_splade:
            shape = list(outputs[self.output])
            vocab = shape[-1] if shape else None
            if len(shape) != 3 or (isinstance(vocab, int) and vocab != spec.vocab_size):
                raise StartupError(
                    f"{self.path}: its logits have shape {shape}; SPLADE needs every token's "
                    f"scores over the vocabulary: (batch, sequence, {spec.vocab_size})"
                )

    def _run(self, batch: Batch, group: list[int]) -> np.ndarray:
        inputs = padded_inputs(batch, group, token_types=self.spec.has_token_types)
        feeds = {k: v for k, v in inputs.items() if k in self.inputs}
        return np.asarray(self.session.run([self.output], feeds)[0])

    def _hidden(self, batch: Batch) -> tuple[torch.Tensor, PackedSequences]:
        """The packed `(total_tokens, hidden)` states of every real token."""
        cu = batch.cu_seqlens
        seqs = PackedSequences(torch.from_numpy(cu.astype(np.int64)), batch.max_seqlen)
        hidden: np.ndarray | None = None
        for group in buckets(batch.lengths.tolist(), max_tokens=self.pass_tokens):
            out = self._run(batch, group)
            if hidden is None:
                hidden = np.empty((batch.total_tokens, out.shape[-1]), dtype=np.float32)
            for row, i in enumerate(group):
                s, e = int(cu[i]), int(cu[i + 1])
                hidden[s:e] = out[row, : e - s]
        assert hidden is not None
        return torch.from_numpy(hidden), seqs

    @torch.inference_mode()
    def embed(self, batch: Batch) -> BatchOutput:
        if batch.size == 0:
            return BatchOutput(None, [])
        if self.spec.is_splade and self.mlm_head is None:
            if not batch.pooled_indices:
                return BatchOutput(None, [])
            with num_threads(1):  # torch's few ops between graph runs: see below
                return BatchOutput(self._splade_from_logits(batch), [])
        hidden, seqs = self._hidden(batch)
        if self.mlm_head is not None and batch.pooled_indices:
            # The vocabulary projection is most of a small SPLADE model's work: on all threads
            # for a batch (SPLADE-tiny, 32-text requests x 4 in flight over HTTP: 83-91 texts/s
            # against 54-56 on one), on one for a short input, whose next graph run would meet
            # torch's idle thread spinning (a query: 2.7-3.1 ms p50 against 5.6-6.5 on all).
            short = batch.total_tokens <= splade_block_rows(self.spec.vocab_size)
            with num_threads(1 if short else torch.get_num_threads()):
                vectors = splade_vectors(self.mlm_head, hidden, seqs, list(batch.pooled_indices))
            return BatchOutput(vectors.numpy(), [])
        # Pooling is a few small ops. On torch's default thread count they start an OpenMP
        # team whose idle thread spins for a while after each op, on the cores ONNX Runtime's
        # own threads need: a short query took 7.3 ms in the server instead of 3.7-4.4.
        with num_threads(1):
            return self._pooled(batch, hidden, seqs)

    def _pooled(self, batch: Batch, hidden: torch.Tensor, seqs: PackedSequences) -> BatchOutput:
        pooled: np.ndarray | None = None
        which = list(batch.pooled_indices)
        if which:
            assert self.spec.pooling is not None
            vectors = pool(hidden, seqs, self.spec.pooling, which)
            for dense in self.dense:
                vectors = dense(vectors)
            pooled = vectors.float().numpy()
        raw = [
            hidden[seqs.starts[i] : seqs.starts[i] + seqs.lengths[i]].numpy()
            for i in batch.raw_indices
        ]
        return BatchOutput(pooled, raw, self.multi.outputs(batch, hidden, seqs))

    def _splade_from_logits(self, batch: Batch) -> np.ndarray:
        """SPLADE vectors from a graph that gives every token's vocabulary scores, run in
        buckets of at most LOGITS_PASS_SCORES scores."""
        which = list(batch.pooled_indices)
        lengths = [int(batch.lengths[i]) for i in which]
        budget = max(LOGITS_PASS_SCORES // max(self.spec.vocab_size, 1), 1)
        best: np.ndarray | None = None
        for group in buckets(lengths, max_tokens=budget):
            scores = torch.from_numpy(self._run(batch, [which[g] for g in group]))
            real = [scores[row, : lengths[g]] for row, g in enumerate(group)]
            vectors = splade_from_logits(torch.cat(real), [lengths[g] for g in group]).numpy()
            if best is None:  # the graph's own vocabulary width
                best = np.empty((len(which), vectors.shape[1]), dtype=np.float32)
            best[group] = vectors
        assert best is not None, "no text to pool"
        return best

    @torch.inference_mode()
    def predict(self, batch: Batch) -> BatchOutput:
        if batch.size == 0:
            return BatchOutput(np.zeros((0, self.spec.num_labels), np.float32), [])
        if self.answer is not None:
            # The answer follows the prompt's very last token, whatever its id.
            hidden, seqs = self._hidden(batch)
            with num_threads(1):
                last = pool(hidden, seqs, "last_token", list(batch.pooled_indices))
                return BatchOutput(self.answer(last).float().numpy(), [])
        logits = np.empty((batch.size, self.spec.num_labels), dtype=np.float32)
        for group in buckets(batch.lengths.tolist(), max_tokens=self.pass_tokens):
            logits[group] = self._run(batch, group)
        return BatchOutput(logits[list(batch.pooled_indices)], [])

    def health(self) -> None:
        return None
