"""Per-model ranges for scalar (int8/uint8) quantization of embeddings.

At start-up the model embeds the packaged calibration texts once; the pooled vectors are kept as
they leave the backend. The ranges a request needs depend on what it asks for (Matryoshka
dimensions, normalization), so they are derived from those vectors per combination, once, and
cached: a request's quantized values then depend only on the model, never on its batch-mates.
"""

from __future__ import annotations

import threading

import numpy as np

from vectorpress.core import postprocess


class Calibration:
    def __init__(self, vectors: np.ndarray) -> None:
        if vectors.ndim != 2 or vectors.shape[0] < 2:
            raise ValueError("calibration needs at least two vectors")
        self.vectors = vectors.astype(np.float32, copy=False)
        self._ranges: dict[tuple[int | None, bool], np.ndarray] = {}
        self._lock = threading.Lock()

    def ranges(self, dimensions: int | None, normalize: bool) -> np.ndarray:
        """(2, dims) float32: per dimension, the lowest and highest calibration value, after the
        same truncation and normalization as the request's vectors."""
        key = (dimensions, normalize)
        found = self._ranges.get(key)
        if found is not None:
            return found
        rows = [postprocess.matryoshka(v, dimensions) for v in self.vectors]
        if normalize:
            rows = [postprocess.l2_normalize(v) for v in rows]
        matrix = np.stack(rows).astype(np.float32, copy=False)
        found = np.vstack((matrix.min(axis=0), matrix.max(axis=0)))
        with self._lock:
            self._ranges[key] = found
        return found
