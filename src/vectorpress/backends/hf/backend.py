"""HFBackend: transformers' own modules on padded batches, for architectures with no native model.

Each batch runs as length buckets (`backends/common/buckets.py`), padded on the right within a
bucket.

The model runs exactly as sentence-transformers runs it (input ids, attention mask and token
types only, the model computing its own positions), so its numbers are the reference's. The
padded output is packed again right after the forward pass: pooling, SPLADE and Dense are
`backends/common`'s, written once for every backend.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vectorpress.backends.common.buckets import buckets, padded_inputs
from vectorpress.backends.common.dense import load_dense
from vectorpress.backends.common.device import pick_device
from vectorpress.backends.common.pooling import pool, splade_from_logits
from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.preemption import add_layer_points
from vectorpress.errors import StartupError
from vectorpress.model_spec import ModelSpec
from vectorpress.types import Batch, BatchOutput

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Padded tokens per forward call at most: activations stay small, and a SPLADE model's logits
# (tokens x vocabulary) stay at 250 MB for a 30,522-token vocabulary.
PASS_TOKENS = 2048


def _dtype_arg() -> str:
    """transformers renamed `torch_dtype` to `dtype` in 4.56; older versions ignore `dtype`."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


_DTYPE_ARG = _dtype_arg()


def _auto_class(spec: ModelSpec) -> Any:
    import transformers

    if spec.kind in ("classifier", "reranker"):
        return transformers.AutoModelForSequenceClassification
    if spec.is_splade:
        return transformers.AutoModelForMaskedLM
    return transformers.AutoModel


class HFBackend:
    """Runs `AutoModel*` on `(n, max_len)` batches padded on the right."""

    name = "hf"
    # Batches run as length buckets (`buckets`), which keep the padded cost near the real token
    # count: the queue budgets real tokens, as for the packed backends.
    is_padded = False
    max_batch_size: int | None = None
    concurrent_passes = False

    def __init__(
        self,
        spec: ModelSpec,
        device: str = "cpu",
        dtype: str | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        """The signature every backend shares (see `backends.base.Backend`); transformers
        loads the checkpoint as it is, so `cache_dir` goes unused."""
        device = pick_device(device)
        self.spec = spec
        self.device = device
        # Gemma's activations outgrow float16's range; its authors run it in bfloat16.
        gpu_default = "bfloat16" if spec.model_type.startswith("gemma") else "float16"
        self.dtype = dtype or ("float32" if device == "cpu" else gpu_default)
        if self.dtype not in _DTYPES:
            raise StartupError(
                f"--dtype {self.dtype} runs on the torch and onnx backends only; "
                f"{spec.model_type} is served by transformers here"
            )
        auto = _auto_class(spec)
        try:
            model = auto.from_pretrained(str(spec.path), **{_DTYPE_ARG: _DTYPES[self.dtype]})
        except (OSError, ValueError, KeyError) as exc:
            raise StartupError(f"transformers cannot load {spec.path}: {exc}") from exc
        self.model = model.eval().to(device)
        # Between layers, a waiting query may run (see backends/preemption.py).
        add_layer_points(self.model)
        params = inspect.signature(self.model.forward).parameters
        self._token_types = "token_type_ids" in params
        self.dense = [
            load_dense(d).eval().to(device=device, dtype=torch.float32) for d in spec.dense
        ]
        text_config = self.model.config.get_text_config()
        if spec.kind != "embedding" and getattr(text_config, "pad_token_id", 0) is None:
            # Decoder classifiers find each row's last token through the pad id; without one,
            # transformers can only score one input per forward pass.
            self.max_batch_size = 1
            log.warning("%s has no pad_token_id: one input per batch", spec.architecture)
        log.info("transformers %s serves %s", type(self.model).__name__, spec.architecture)

    def _padded(self, batch: Batch, group: list[int]) -> dict[str, torch.Tensor]:
        """The inputs of `group`'s texts, padded on the right to the longest of them."""
        wanted = ["input_ids", "attention_mask"]
        if self._token_types:
            wanted.append("token_type_ids")
        inputs = padded_inputs(
            batch, group, self.spec.pad_token_id, token_types=self.spec.has_token_types
        )
        return {k: torch.from_numpy(inputs[k]).to(self.device) for k in wanted}

    def _groups(self, batch: Batch) -> list[list[int]]:
        return buckets(batch.lengths.tolist(), max_tokens=PASS_TOKENS)

    def _seqs(self, batch: Batch) -> PackedSequences:
        return PackedSequences(torch.from_numpy(batch.cu_seqlens).to(self.device), batch.max_seqlen)

    @torch.inference_mode()
    def embed(self, batch: Batch) -> BatchOutput:
        if batch.size == 0:
            return BatchOutput(None, [])
        seqs = self._seqs(batch)
        which = list(batch.pooled_indices)
        raw_wanted = set(batch.raw_indices)
        # Raw outputs of a SPLADE model are its per-token hidden states, as TEI's.
        hidden: torch.Tensor | None = None
        pooled: np.ndarray | None = None
        place = {i: k for k, i in enumerate(which)}
        for group in self._groups(batch):
            inputs = self._padded(batch, group)
            real = inputs["attention_mask"].bool()
            splade_states = self.spec.is_splade and bool(raw_wanted.intersection(group))
            out = self.model(**inputs, output_hidden_states=splade_states)
            if self.spec.is_splade:
                rows = [r for r, i in enumerate(group) if i in place]
                if rows:
                    # Pooled group by group: a batch's tokens x vocabulary logits never exist
                    # at once (2,048 padded tokens of a 30,522-token vocabulary: 250 MB).
                    lengths = [seqs.lengths[group[r]] for r in rows]
                    logits = out.logits[rows][real[rows]]
                    vectors = splade_from_logits(logits, lengths).cpu().numpy()
                    if pooled is None:
                        pooled = np.empty((len(which), vectors.shape[1]), dtype=np.float32)
                    pooled[[place[group[r]] for r in rows]] = vectors
                states = out.hidden_states[-1] if splade_states else None
            else:
                states = out.last_hidden_state
            if states is not None:
                if hidden is None:
                    hidden = states.new_empty((batch.total_tokens, states.shape[-1]))
                for row, i in enumerate(group):
                    s = seqs.starts[i]
                    hidden[s : s + seqs.lengths[i]] = states[row, : seqs.lengths[i]]
        if which and not self.spec.is_splade:
            assert self.spec.pooling is not None and hidden is not None
            vectors_t = pool(hidden, seqs, self.spec.pooling, which).float()
            for dense in self.dense:
                vectors_t = dense(vectors_t)
            pooled = vectors_t.cpu().numpy()
        raw = []
        if hidden is not None:
            raw = [
                hidden[seqs.starts[i] : seqs.starts[i] + seqs.lengths[i]].float().cpu().numpy()
                for i in batch.raw_indices
            ]
        return BatchOutput(pooled, raw)

    @torch.inference_mode()
    def predict(self, batch: Batch) -> BatchOutput:
        scores: torch.Tensor | None = None
        for group in self._groups(batch):
            logits = self.model(**self._padded(batch, group)).logits
            if scores is None:
                scores = logits.new_empty((batch.size, logits.shape[-1]))
            scores[group] = logits
        if scores is None:
            return BatchOutput(np.zeros((0, self.spec.num_labels), np.float32), [])
        rows = scores[list(batch.pooled_indices)]
        return BatchOutput(rows.float().cpu().numpy(), [])

    def health(self) -> None:
        return None
