"""HFBackend: transformers' own modules on padded batches, for architectures with no native model.

The model runs exactly as sentence-transformers runs it (input ids, attention mask and token
types only, the model computing its own positions), so its numbers are the reference's. The
padded output is packed again right after the forward pass: pooling, SPLADE and Dense are the
torch backend's, written once.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import numpy as np
import torch

from vectorpress.backends.torch.attention import PackedSequences
from vectorpress.backends.torch.heads import load_dense
from vectorpress.backends.torch.pooling import pool, rows_of, splade_block_rows, splade_pool
from vectorpress.errors import StartupError
from vectorpress.model_spec import ModelSpec
from vectorpress.types import Batch, BatchOutput

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


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
    is_padded = True
    max_batch_size: int | None = None

    def __init__(self, spec: ModelSpec, device: str = "cpu", dtype: str | None = None) -> None:
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
        params = inspect.signature(self.model.forward).parameters
        # Models without token types (RoBERTa's type_vocab_size 1, DistilBERT, decoders) get
        # none: a pair's second segment would index past their single type embedding.
        self._token_types = "token_type_ids" in params and (
            int(getattr(self.model.config, "type_vocab_size", 0) or 0) > 1
        )
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

    def _padded(self, batch: Batch) -> dict[str, torch.Tensor]:
        n, width = batch.size, batch.max_seqlen
        lengths = batch.lengths
        mask = np.arange(width)[None, :] < lengths[:, None]
        ids = np.full((n, width), self.spec.pad_token_id, dtype=np.int64)
        ids[mask] = batch.input_ids
        inputs = {
            "input_ids": torch.from_numpy(ids),
            "attention_mask": torch.from_numpy(mask.astype(np.int64)),
        }
        if self._token_types:
            types = np.zeros((n, width), dtype=np.int64)
            types[mask] = batch.token_type_ids
            inputs["token_type_ids"] = torch.from_numpy(types)
        return {k: v.to(self.device) for k, v in inputs.items()}

    def _packed(self, padded: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """(n, max_len, d) -> (total_tokens, d), real tokens only, in batch order."""
        return padded[inputs["attention_mask"].bool()]

    def _seqs(self, batch: Batch) -> PackedSequences:
        return PackedSequences(torch.from_numpy(batch.cu_seqlens).to(self.device), batch.max_seqlen)

    @torch.inference_mode()
    def embed(self, batch: Batch) -> BatchOutput:
        inputs = self._padded(batch)
        # Raw outputs of a SPLADE model are its per-token hidden states, as TEI's.
        want_states = self.spec.is_splade and bool(batch.raw_indices)
        out = self.model(**inputs, output_hidden_states=want_states)
        seqs = self._seqs(batch)
        which = list(batch.pooled_indices)
        pooled: np.ndarray | None = None
        hidden: torch.Tensor | None = None
        if self.spec.is_splade:
            if which:
                logits, lengths = rows_of(self._packed(out.logits, inputs), seqs, which)
                blocks = splade_block_rows(logits.shape[1])
                pooled = splade_pool(lambda x: x, logits, lengths, blocks).cpu().numpy()
            if want_states:
                hidden = self._packed(out.hidden_states[-1], inputs)
        else:
            hidden = self._packed(out.last_hidden_state, inputs)
            if which:
                assert self.spec.pooling is not None
                vectors = pool(hidden, seqs, self.spec.pooling, which).float()
                for dense in self.dense:
                    vectors = dense(vectors)
                pooled = vectors.cpu().numpy()
        raw = []
        if hidden is not None:
            raw = [
                hidden[seqs.starts[i] : seqs.starts[i] + seqs.lengths[i]].float().cpu().numpy()
                for i in batch.raw_indices
            ]
        return BatchOutput(pooled, raw)

    @torch.inference_mode()
    def predict(self, batch: Batch) -> BatchOutput:
        inputs = self._padded(batch)
        logits = self.model(**inputs).logits
        rows = logits[list(batch.pooled_indices)]
        return BatchOutput(rows.float().cpu().numpy(), [])

    def health(self) -> None:
        return None
