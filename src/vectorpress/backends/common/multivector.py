"""Heads with more than one vector per text: bge-m3's sparse and ColBERT heads, written once.

They take the packed rows of the sequences that want them, `lengths[i]` rows one after another
(`(rows, hidden)`), whatever backend produced the hidden states, and return one dict of arrays
per sequence under the `MultiOutput` keys.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vectorpress.backends.common.dense import load_dense
from vectorpress.backends.common.pooling import rows_of
from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.errors import StartupError
from vectorpress.model_spec import M3Spec, ModelSpec
from vectorpress.types import Batch

#: Keys of a MULTI entry's dict: the pooled dense vector, the sparse weights as parallel arrays
#: of token ids and weights (ids ascending), and the per-token vectors.
DENSE, SPARSE_IDS, SPARSE_WEIGHTS, COLBERT = "dense", "sparse_ids", "sparse_weights", "colbert"


class M3Heads(nn.Module):
    """bge-m3's heads: `colbert_linear` (hidden -> colbert_dim) on every token after CLS, and
    `sparse_linear` (hidden -> 1) whose ReLU is a token's lexical weight."""

    def __init__(self, hidden: int, colbert_dim: int) -> None:
        super().__init__()
        self.colbert_linear = nn.Linear(hidden, colbert_dim)
        self.sparse_linear = nn.Linear(hidden, 1)


def load_m3_heads(spec: M3Spec, hidden: int) -> M3Heads:
    from vectorpress.backends.common.loader import strict_load

    heads = M3Heads(hidden, spec.colbert_dim)
    state = {}
    for prefix, path in (
        ("colbert_linear", spec.colbert_path),
        ("sparse_linear", spec.sparse_path),
    ):
        try:
            part = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise StartupError(f"cannot read {path}: {exc}") from exc
        state.update({f"{prefix}.{k}": v for k, v in part.items()})
    strict_load(heads, state, what=f"bge-m3 heads of {spec.colbert_path.parent}")
    return heads.eval()


def lexical_weights(
    weights: np.ndarray, ids: np.ndarray, unused: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """One text's sparse vector: for each token id, the max of its tokens' weights; ids in
    `unused` and zero weights left out (FlagEmbedding's lexical weights)."""
    keep = (weights > 0) & ~np.isin(ids, unused)
    ids, weights = ids[keep], weights[keep]
    if not len(ids):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    order = np.lexsort((weights, ids))  # by id, then weight: each id's last row is its max
    ids, weights = ids[order], weights[order]
    last = np.flatnonzero(np.append(ids[1:] != ids[:-1], True))
    return ids[last].astype(np.int64), weights[last].astype(np.float32)


def m3_outputs(
    heads: M3Heads,
    rows: torch.Tensor,
    lengths: list[int],
    ids: np.ndarray,
    unused: tuple[int, ...],
) -> list[dict[str, np.ndarray]]:
    """Dense (CLS, not normalized: the pipeline does that per request), sparse and ColBERT
    (normalized, every token after CLS) outputs of each sequence from one set of rows."""
    rows = rows.to(heads.sparse_linear.weight.dtype)
    weights = torch.relu(heads.sparse_linear(rows)).squeeze(-1).float().cpu().numpy()
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    after_cls = torch.ones(rows.shape[0], dtype=torch.bool, device=rows.device)
    after_cls[torch.from_numpy(starts).to(rows.device)] = False
    colbert = F.normalize(heads.colbert_linear(rows[after_cls]).float(), dim=-1).cpu().numpy()
    dense = rows[torch.from_numpy(starts).to(rows.device)].float().cpu().numpy()
    out = []
    done = 0
    for i, (start, n) in enumerate(zip(starts.tolist(), lengths, strict=True)):
        sparse_ids, sparse_weights = lexical_weights(
            weights[start : start + n], ids[start : start + n], unused
        )
        out.append(
            {
                DENSE: dense[i],
                SPARSE_IDS: sparse_ids,
                SPARSE_WEIGHTS: sparse_weights,
                COLBERT: colbert[done : done + n - 1],
            }
        )
        done += n - 1
    return out


def colbert_outputs(
    project: Callable[[torch.Tensor], torch.Tensor], rows: torch.Tensor, lengths: list[int]
) -> list[dict[str, np.ndarray]]:
    """A ColBERT model's per-token vectors: every row projected, then normalized. Which rows a
    caller keeps (a document's skip-list) is the pipeline's choice, on the token ids."""
    vectors = F.normalize(project(rows).float(), dim=-1).cpu().numpy()
    bounds = [0, *itertools.accumulate(lengths)]
    return [{COLBERT: vectors[a:b]} for a, b in itertools.pairwise(bounds)]


class MultiVectorHeads:
    """A model's heads that read every token's hidden state (bge-m3's, or a ColBERT model's
    projection), in float32 torch on `device` whatever backend made the hidden states, so that
    every backend turns its MULTI entries into the same outputs."""

    def __init__(self, spec: ModelSpec, device: str | torch.device = "cpu") -> None:
        self.architecture = spec.architecture
        self.m3 = (
            load_m3_heads(spec.m3, spec.hidden_size).to(device=device, dtype=torch.float32)
            if spec.m3 is not None
            else None
        )
        self.unused_token_ids = spec.m3.unused_token_ids if spec.m3 is not None else ()
        self.colbert = (
            nn.Sequential(*(load_dense(d) for d in spec.colbert.dense))
            .eval()
            .to(device=device, dtype=torch.float32)
            if spec.colbert is not None
            else None
        )

    def outputs(
        self, batch: Batch, hidden: torch.Tensor, seqs: PackedSequences
    ) -> list[dict[str, np.ndarray]]:
        """The outputs of the batch's MULTI entries, from its packed hidden states."""
        which = list(batch.multi_indices)
        if not which:
            return []
        rows, lengths = rows_of(hidden, seqs, which)
        if self.colbert is not None:
            return colbert_outputs(self.colbert, rows.float(), lengths)
        if self.m3 is None:
            raise StartupError(f"{self.architecture} has no multi-vector head")
        cu = batch.cu_seqlens
        ids = np.concatenate([batch.input_ids[cu[i] : cu[i + 1]] for i in which])
        return m3_outputs(self.m3, rows.float(), lengths, ids, self.unused_token_ids)
