"""A BERT encoder's fp32 graph with ONNX Runtime's transformer fusions, for the torch
backend's short CPU passes (`backends/torch/short_graph.py`).

ONNX Runtime's own graph optimizations leave an exported BERT as dozens of small nodes per
layer: the embeddings' gathers and sums, attention's reshapes, transposes and masked softmax,
each residual add before its LayerNorm. Its transformer optimizer (`onnxruntime.transformers`)
rewrites them into one `EmbedLayerNormalization`, one `Attention` per layer (the padding mask
inside), `SkipLayerNormalization` (the residual add and the LayerNorm in one pass) and
`BiasGelu`, which a one-text pass, made of many small ops, feels most. all-MiniLM-L6-v2 on the
2-core AVX2 EPYC, in-process, four alternated rounds of 100 passes: 8 tokens 2.94-3.33 ms
against 3.38-4.65, 16 tokens 4.31-4.83 against 4.80-5.28, 32 tokens 7.09-7.87 against
7.63-8.84; the default server's short query over HTTP (six alternated rounds of 100) 6.99 ms
p50 against 7.77, its inference 5.62 ms against 6.51. Bulk passes gain nothing (600 corpus
texts in batches of 32: 4,307-5,231 against 4,449-5,055 tokens/s; on a Zen 4, 7.2-7.4k against
7.5k), so `--backend onnx` serves the graph as exported.

The fused graph is built once beside the exported one and kept only where it gives the same
hidden states as the graph it came from on the packaged calibration texts, padded in one batch
(within TOLERANCE); where the optimizer fails, fuses no attention or the states differ, the
exported graph is served, and a marker file keeps later starts from trying again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np

from vectorpress.backends.common.buckets import padded_inputs
from vectorpress.backends.common.calibration import calibration_batch
from vectorpress.backends.onnx.export import build_once, graph_stamp, run_graph
from vectorpress.errors import StartupError
from vectorpress.model_spec import ModelSpec

log = logging.getLogger(__name__)

#: Part of the cache key: changes whenever what `fuse_graph` writes changes.
FUSION = "ort-bert-v1"
#: Encoders whose exported graph the optimizer's BERT patterns fit (absolute positions from 0,
#: token types): the ones measured. Others are served unfused.
FUSED_TYPES = frozenset({"bert"})
#: Widest encoder fused: the fusions cut per-op overhead, which only narrow encoders' short
#: passes feel. One-text passes on the 2-core AVX2 EPYC, four alternated rounds of 60 (random
#: BERT weights of real shapes): 12 layers x 384 (bge-small's shape) 8 tokens 4.18-4.32 ms
#: against 4.46-4.60, 16 tokens 5.98-6.08 against 6.13-6.39, 32 tokens 10.82-11.19 against
#: 10.70-10.87; 12 x 768 (BERT-base's: bge-base, e5-base) 8 and 16 tokens level, 32 tokens
#: 39.6-42.1 against 38.4-38.6 (slower). DistilBERT and RoBERTa of 6 x 768, which the optimizer
#: fuses within 1e-6, ran level or slower alike (32 tokens: 20.0 against 19.5 ms), so they stay
#: out of FUSED_TYPES. On an AMX Xeon with AVX-512 the width held too (six alternated rounds of
#: 40, medians): 12 x 384 8 tokens 4.27 against 4.72 ms, 16 5.83 against 6.27, 32 9.35 against
#: 9.53; 12 x 768 18.09 against 18.36, 22.03 against 22.25, 32.61 against 32.24.
MAX_FUSED_WIDTH = 384
#: Largest difference of a hidden-state value between the fused and the unfused graph: the
#: fused kernels sum in another order (all-MiniLM-L6-v2: at most 3.4e-6).
TOLERANCE = 1e-4
NOT_FUSED = "not-fused.json"
#: The calibration texts run together, padded to the longest, so the mask is checked too.
CHECK_TEXTS = 8


class NotFused(StartupError):
    """The optimizer failed or fused no attention, or the fused graph's states differ from the
    graph's: the same at every start (`build_once` passes it on as it is)."""


def fused_key(graph: Path) -> str:
    """What a fused graph was made from: the graph file and onnxruntime's version."""
    import onnxruntime as ort

    parts = [*graph_stamp(graph), FUSION, ort.__version__]
    return "fused-" + hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:20]


def fusable(spec: ModelSpec, graph: Path) -> bool:
    """A pooled embedding model of a type and width the fusions were measured faster on, in one
    file (a graph with external data is a model too large for short passes on a graph). Models
    that serve every token's values (multi-vector, SPLADE) keep the graph they were tested on."""
    if spec.model_type not in FUSED_TYPES or int(spec.position_offset) != 0:
        return False
    if spec.hidden_size > MAX_FUSED_WIDTH:
        return False
    if spec.kind != "embedding" or spec.has_multi_vector or spec.is_splade or spec.llm_rerank:
        return False
    return not any(graph.parent.glob(graph.name + "?data"))


def fused_graph(
    graph: Path, spec: ModelSpec, cache_dir: Path, tolerance: float = TOLERANCE
) -> Path:
    """`graph` with the transformer fusions where they hold (built once, then read from the
    cache), else `graph` itself."""
    if not fusable(spec, graph):
        return graph
    final = cache_dir / fused_key(graph)
    marker = final.with_name(final.name + "." + NOT_FUSED)
    if marker.is_file():
        return graph

    def build(out: Path) -> None:
        fuse_graph(graph, out, spec, tolerance)

    try:
        fused = build_once(final, build, f"cannot fuse {graph}", "it is served unfused")
    except NotFused as exc:
        log.info("%s is served unfused: %s", graph, exc)
        with contextlib.suppress(OSError):  # a read-only cache: the next start tries again
            marker.write_text(json.dumps({"reason": str(exc)}))
        return graph
    except StartupError as exc:  # a cache that cannot be written, say: tried again next start
        log.warning("%s", exc)
        return graph
    log.info("fused onnx graph %s", fused)
    return fused


def fuse_graph(graph: Path, out: Path, spec: ModelSpec, tolerance: float = TOLERANCE) -> None:
    """Write `graph` with the fusions to `out`; NotFused where they do not apply or hold."""
    from onnxruntime.transformers import optimizer

    quiet_optimizer_logs(Path(optimizer.__file__).parent)
    config = spec.config
    try:
        model = optimizer.optimize_model(
            str(graph),
            model_type="bert",
            num_heads=int(config["num_attention_heads"]),
            hidden_size=int(config["hidden_size"]),
            opt_level=0,  # the fusions only: ONNX Runtime's own optimizations run at each load
        )
    except Exception as exc:  # the same graph and optimizer fail alike at every start
        raise NotFused(f"the optimizer failed ({type(exc).__name__}: {exc})") from exc
    fused = {k: v for k, v in model.get_fused_operator_statistics().items() if v}
    if not fused.get("Attention") or not fused.get("SkipLayerNormalization"):
        raise NotFused(f"the optimizer fused only {fused or 'nothing'}")
    model.save_model_to_file(str(out))
    worst = largest_difference(graph, out, spec)
    if not worst <= tolerance:  # a NaN fails too
        raise NotFused(f"its hidden states differ by up to {worst:.2e} (> {tolerance:.0e})")
    log.info("fused %s (%s); largest difference %.1e", graph, fused, worst)


def quiet_optimizer_logs(folder: Path) -> None:
    """The optimizer's modules log every fusion at INFO under their bare module names
    (`onnx_model`, `fusion_base`, ...): a dozen lines in the server's log at a first start, where
    `fuse_graph` logs one. Warnings still show."""
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if path and Path(path).parent == folder:
            logging.getLogger(name).setLevel(logging.WARNING)


def largest_difference(graph: Path, fused: Path, spec: ModelSpec) -> float:
    """The largest difference between the two graphs' outputs on the calibration texts, run
    together (padded) and the first alone."""
    import onnxruntime as ort

    from vectorpress.backends.onnx.backend import session_options

    batch = calibration_batch(spec)
    n = min(batch.size, CHECK_TEXTS)
    feeds = [padded_inputs(batch, list(range(n)), token_types=spec.has_token_types)]
    feeds.append(padded_inputs(batch, [0], token_types=spec.has_token_types))
    worst = 0.0
    sessions: list[Any] = [
        ort.InferenceSession(str(p), session_options(), providers=["CPUExecutionProvider"])
        for p in (graph, fused)
    ]
    for feed in feeds:
        want, got = (np.asarray(run_graph(session, None, feed)[0]) for session in sessions)
        if want.shape != got.shape:
            return float("inf")
        if want.ndim == 3:  # per token: the padded places are nobody's values
            mask = feed["attention_mask"].astype(bool)
            want, got = want[mask], got[mask]
        worst = max(worst, float(np.abs(want - got).max()))
    return worst
