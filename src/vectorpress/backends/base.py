"""The backend contract: plain data in (a packed Batch), plain arrays out."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from vectorpress.model_spec import ModelSpec
from vectorpress.types import Batch, BatchOutput


@runtime_checkable
class Backend(Protocol):
    """What the pipeline needs from a backend. Every method runs on the worker thread."""

    name: str
    """torch, hf, onnx, fake..."""
    dtype: str
    device: str
    is_padded: bool
    """Whether the batch's cost is max_len * n (padded) rather than its real tokens."""
    max_batch_size: int | None
    """A cap on inputs per batch that overrides --max-batch-requests, if any."""

    def embed(self, batch: Batch) -> BatchOutput:
        """Pooled vectors (Dense applied; SPLADE vectors for SPLADE models) and raw states."""
        ...

    def predict(self, batch: Batch) -> BatchOutput:
        """Class logits, one row per pooled entry."""
        ...

    def health(self) -> None:
        """Raise if the device cannot run work."""
        ...


class FakeBackend:
    """Deterministic vectors from token ids, for API tests that need no weights.

    Each vector is a fixed random projection of the mean one-hot token histogram, so equal
    inputs give equal vectors and different inputs give different ones.
    """

    name = "fake"
    dtype = "float32"
    device = "cpu"
    is_padded = False
    max_batch_size: int | None = None

    def __init__(self, spec: ModelSpec, dim: int | None = None) -> None:
        self.spec = spec
        self.dim = dim or spec.embedding_size or 8
        rng = np.random.default_rng(0)
        self._table = rng.standard_normal((max(spec.vocab_size, 1), self.dim)).astype(np.float32)
        self.fail_next: Exception | None = None

    def _hidden(self, batch: Batch) -> np.ndarray:
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        return self._table[batch.input_ids % len(self._table)]

    def embed(self, batch: Batch) -> BatchOutput:
        hidden = self._hidden(batch)
        cu = batch.cu_seqlens
        pooled = (
            np.stack([hidden[cu[i] : cu[i + 1]].mean(0) for i in batch.pooled_indices])
            if batch.pooled_indices
            else None
        )
        raw = [hidden[cu[i] : cu[i + 1]] for i in batch.raw_indices]
        return BatchOutput(pooled, raw)

    def predict(self, batch: Batch) -> BatchOutput:
        out = self.embed(batch)
        assert out.pooled is not None
        n = max(self.spec.num_labels, 1)
        return BatchOutput(out.pooled[:, :n], [])

    def health(self) -> None:
        return None
