"""Pure functions applied to a backend's pooled outputs."""

from __future__ import annotations

import numpy as np

from vectorpress.errors import BackendError


def matryoshka(vector: np.ndarray, dimensions: int | None) -> np.ndarray:
    """Keep the first `dimensions` values (checked against the size before inference)."""
    return vector if dimensions is None else vector[:dimensions]


def l2_normalize(vector: np.ndarray) -> np.ndarray:
    vector = vector.astype(np.float32, copy=False)
    # np.linalg.norm's own arithmetic for a vector (the same bits), without its dispatch: it
    # runs once per answered vector, on the event loop, with the caches cold from the forward.
    norm = float(np.sqrt(vector.dot(vector)))
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


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """Late interaction: the sum over query tokens of the best dot product over document
    tokens (`(q, dim)` and `(d, dim)`)."""
    if not len(query) or not len(document):
        return 0.0
    sims = query.astype(np.float32) @ document.astype(np.float32).T
    return float(sims.max(axis=1).astype(np.float64).sum())


def sparse_dot(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Dot product of two sparse vectors given as (ascending ids, weights)."""
    _, ia, ib = np.intersect1d(a[0], b[0], assume_unique=True, return_indices=True)
    return float(np.dot(a[1][ia].astype(np.float64), b[1][ib].astype(np.float64)))


#: FlagEmbedding's `compute_score` weights of dense, sparse and ColBERT when none are given.
M3_DEFAULT_WEIGHTS = (1.0, 1.0, 1.0)


def m3_scores(
    query: dict[str, np.ndarray], passage: dict[str, np.ndarray], weights: tuple[float, ...]
) -> dict[str, float]:
    """bge-m3's relevance scores of a passage for a query (FlagEmbedding's compute_score):
    dense dot product of normalized CLS vectors, sparse dot product of lexical weights, ColBERT
    MaxSim averaged over the query's tokens, and their weighted mean."""
    dense = float(np.dot(l2_normalize(query["dense"]), l2_normalize(passage["dense"])))
    sparse = sparse_dot(
        (query["sparse_ids"], query["sparse_weights"]),
        (passage["sparse_ids"], passage["sparse_weights"]),
    )
    q_vecs = query["colbert"]
    colbert = maxsim(q_vecs, passage["colbert"]) / max(len(q_vecs), 1)
    w_dense, w_sparse, w_colbert = weights
    return {
        "dense": dense,
        "sparse": sparse,
        "colbert": colbert,
        "sparse+dense": (w_sparse * sparse + w_dense * dense) / (w_sparse + w_dense)
        if w_sparse + w_dense > 0
        else 0.0,
        "colbert+sparse+dense": (w_colbert * colbert + w_sparse * sparse + w_dense * dense)
        / sum(weights),
    }
