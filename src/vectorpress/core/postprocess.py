"""Pure functions applied to a backend's pooled outputs."""

from __future__ import annotations

import numpy as np

from vectorpress.errors import BackendError


def matryoshka(vector: np.ndarray, dimensions: int | None) -> np.ndarray:
    """Keep the first `dimensions` values (checked against the size before inference)."""
    return vector if dimensions is None else vector[:dimensions]


def l2_normalize(vector: np.ndarray) -> np.ndarray:
    vector = vector.astype(np.float32, copy=False)
    norm = float(np.linalg.norm(vector))
    # A zero vector stays zero rather than turning into NaNs.
    return vector / norm if norm > 0 else vector.copy()


def class_scores(logits: np.ndarray, raw_scores: bool) -> np.ndarray:
    """Sigmoid for one class, softmax for several, logits as they are when asked raw."""
    logits = logits.astype(np.float32, copy=False)
    if raw_scores:
        scores = logits.copy()
    elif logits.shape[-1] == 1:
        scores = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    else:
        shifted = logits.astype(np.float64) - logits.max()
        exp = np.exp(shifted)
        scores = exp / exp.sum()
    scores = scores.astype(np.float32)
    if np.isnan(scores).any():
        raise BackendError("score is NaN")
    return scores


def sparsify(vector: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Indices (ascending) and values of the non-zero entries."""
    indices = np.flatnonzero(vector)
    return indices.astype(np.int64), vector[indices].astype(np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a.astype(np.float64), b.astype(np.float64)) / (na * nb))


def rerank_order(scores: list[float]) -> list[int]:
    """Indices by score descending; on a tie the higher index comes first, as TEI."""
    return sorted(range(len(scores)), key=lambda i: (scores[i], i), reverse=True)
