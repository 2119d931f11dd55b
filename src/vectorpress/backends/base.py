"""The backend contract: plain data in (a packed Batch), plain arrays out."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from vectorpress.types import Batch, BatchOutput


@runtime_checkable
class Backend(Protocol):
    """What the pipeline needs from a backend. Every method runs on the device thread, or,
    where `concurrent_passes`, on any of the scheduler's runners."""

    name: str
    """torch, hf or onnx."""
    dtype: str
    device: str
    is_padded: bool
    """Whether the batch's cost is max_len * n (padded) rather than its real tokens."""
    max_batch_size: int | None
    """A cap on inputs per batch that overrides --max-batch-requests, if any."""
    concurrent_passes: bool
    """Whether batches may run on several threads at once, each pass on the intra-op threads
    of the thread that calls it (the scheduler's runners)."""

    def embed(self, batch: Batch) -> BatchOutput:
        """Pooled vectors (Dense applied; SPLADE vectors for SPLADE models) and raw states."""
        ...

    def predict(self, batch: Batch) -> BatchOutput:
        """Class logits, one row per pooled entry."""
        ...

    def health(self) -> None:
        """Raise if the device cannot run work."""
        ...
