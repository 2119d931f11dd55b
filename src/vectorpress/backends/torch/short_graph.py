"""Short CPU passes on the encoder's ONNX graph, run by ONNX Runtime, where start-up timed it
faster than the native model (see `passes.plan_passes`) and the compiled kernel does not build
(`short_kernel.py`; `TorchBackend._shortcuts` says why not both).

A one-query pass multiplies a handful of rows by every weight matrix. On a 2-core AVX2-only
EPYC, torch's kernels for such GEMMs (oneDNN's, MKL's behind F.linear, MKL's packed ones) all
ran behind ONNX Runtime's: all-MiniLM-L6-v2's 16-token query took 15.3-15.6 ms p50 in-process
on the native model and 5.8-7.2 with this backend's short passes on the exported graph (three
alternated rounds), the pooled vectors within 1e-6 of each other. Larger
passes stay native: there the two ran level in-process (600 corpus texts in batches of 32,
five alternated rounds: 13.8 against 13.4 s), and only the native model stops between layers
for waiting interactive work (`backends/preemption.py`).

The graph is exported from the checkpoint's own weights (never a shipped model.onnx, which
may be of other weights) and cached as `--backend onnx` caches it, with ONNX Runtime's
transformer fusions where they hold (`onnx/fuse.py`: a BERT's short query about 10% faster);
it keeps a second copy of the weights in memory, so only encoders up to MAX_PARAMETERS get one.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.torch.registry import Architecture
from vectorpress.errors import StartupError
from vectorpress.model_spec import ModelSpec

log = logging.getLogger(__name__)

# A second copy of the weights, and an export that grows with them (about 13 s for
# all-MiniLM-L6-v2's 23M parameters on the AVX2 EPYC): base-sized encoders at most.
MAX_PARAMETERS = 150_000_000


class ShortGraph:
    """The encoder's last hidden states from ONNX Runtime, in the packed layout: called as the
    native encoder is, `(input_ids, token_type_ids, position_ids, seqs)`."""

    def __init__(self, session: Any, output: str, inputs: set[str]) -> None:
        self.session = session
        self.output = output
        self.inputs = inputs

    def __call__(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        position_ids: torch.Tensor,
        seqs: PackedSequences,
    ) -> torch.Tensor:
        # The graph computes each sequence's positions itself, from 0 (or the model's offset),
        # as every encoding here has them (`types.Batch`): position_ids are not an input.
        del position_ids
        lengths = np.asarray(seqs.lengths)
        width = int(lengths.max())
        # Padded row-major places of the packed tokens, sequence by sequence.
        places = np.concatenate([i * width + np.arange(n) for i, n in enumerate(lengths)])
        ids = np.zeros(len(lengths) * width, dtype=np.int64)
        ids[places] = input_ids.numpy()
        mask = np.zeros_like(ids)
        mask[places] = 1
        flat = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self.inputs:
            types = np.zeros_like(ids)
            types[places] = token_type_ids.numpy()
            flat["token_type_ids"] = types
        shape = (len(lengths), width)
        feeds = {name: value.reshape(shape) for name, value in flat.items()}
        out = np.asarray(self.session.run([self.output], feeds)[0])
        return torch.from_numpy(out.reshape(-1, out.shape[-1])[places])


def short_graph_fits(spec: ModelSpec, arch: Architecture) -> bool:
    """Whether short passes may run on the encoder's exported graph: an embedding model's
    encoder with positions the graph computes alike (absolute or relative ones, not rotary
    tables, which the native models extend past transformers'), pooled: multi-vector models
    serve every token's values, where the graph's last bits show unaveraged (a ColBERT
    document's token values came 1.3e-4 from PyLate's, relatively, on the graph)."""
    return (
        spec.kind == "embedding"
        and spec.llm_rerank is None
        and not spec.has_multi_vector
        and not arch.rotary
    )


def graph_candidate(spec: ModelSpec, parameters: int, cache_dir: Path) -> ShortGraph | None:
    """The exported graph of `spec`'s encoder for short passes, or None (logged) where it
    cannot be had: no onnxruntime, too large a model, an export that fails."""
    if parameters > MAX_PARAMETERS:
        return None
    try:
        import onnxruntime as ort

        from vectorpress.backends.onnx.backend import session_options
        from vectorpress.backends.onnx.export import cached_graph
        from vectorpress.backends.onnx.fuse import fused_graph
    except ImportError:
        log.info("short passes stay native: onnxruntime and onnx are not installed")
        return None
    try:
        path = fused_graph(cached_graph(spec.path, "embedding", cache_dir), spec, cache_dir)
        session = ort.InferenceSession(
            str(path), session_options(), providers=["CPUExecutionProvider"]
        )
    except StartupError as exc:
        log.warning("short passes stay native: %s", exc)
        return None
    except Exception as exc:  # onnxruntime raises its own exception types
        log.warning("short passes stay native: cannot load the exported graph (%s)", exc)
        return None
    inputs = {i.name for i in session.get_inputs()}
    return ShortGraph(session, session.get_outputs()[0].name, inputs)
