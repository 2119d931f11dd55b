"""The attention every fast path is tested against: one explicit softmax(QK^T)V per sequence."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.torch.attention import ScoreBias


def allowed(length: int, causal: bool, window: int | None) -> torch.Tensor:
    """(query, key) pairs a query may attend to, spelled out from the definitions rather than
    taken from the code under test: a causal query sees no later key; a window of W keeps keys
    at distance <= W // 2 (the span the model configs give, half on each side)."""
    query = torch.arange(length).unsqueeze(1)
    key = torch.arange(length).unsqueeze(0)
    ok = torch.ones(length, length, dtype=torch.bool)
    if causal:
        ok &= key <= query
    if window is not None:
        ok &= (query - key).abs() <= window // 2
    return ok


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seqs: PackedSequences,
    *,
    causal: bool = False,
    window: int | None = None,
    scale: float | None = None,
    bias: Callable[[int, torch.dtype], torch.Tensor] | None = None,
    precision: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Packed `(total_tokens, heads, head_dim)` inputs, one sequence at a time, in float32 (or
    `precision`); k and v heads repeated for grouped-query attention; a sequence with a key
    length attends to its first `key_lengths[i]` tokens only."""
    rep = q.shape[1] // k.shape[1]
    out = torch.empty_like(q, dtype=torch.promote_types(q.dtype, precision))
    key_lengths = seqs.lengths if seqs.key_lengths is None else seqs.key_lengths
    for s, n, keys in zip(seqs.starts, seqs.lengths, key_lengths, strict=True):
        qs = q[s : s + n].to(precision).transpose(0, 1)
        ks = k[s : s + n].to(precision).transpose(0, 1).repeat_interleave(rep, 0)
        vs = v[s : s + n].to(precision).transpose(0, 1).repeat_interleave(rep, 0)
        scores = qs @ ks.transpose(1, 2) * (scale if scale is not None else qs.shape[-1] ** -0.5)
        if bias is not None:
            scores = scores + bias(n, torch.float32).to(precision)
        mask = allowed(n, causal, window).to(q.device)
        mask[:, keys:] = False
        scores = scores.masked_fill(~mask, float("-inf"))
        out[s : s + n] = (scores.softmax(-1) @ vs).transpose(0, 1).to(out.dtype)
    return out.to(q.dtype) if precision == torch.float32 else out


def packed(
    lengths: list[int], *, varlen: bool = False, key_lengths: list[int] | None = None
) -> PackedSequences:
    """Sequences of these lengths side by side, their bounds int32 as a batch's are."""
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    return PackedSequences(cu, max(lengths), varlen=varlen, key_lengths=key_lengths)


def relative_bias(heads: int, seed: int = 0, reach: int = 400) -> ScoreBias:
    """An MPNet-like score bias: a value per head and distance j - i (|j - i| <= reach)."""
    table = torch.randn(heads, 2 * reach + 1, generator=torch.Generator().manual_seed(seed))

    def bias(n: int, dtype: torch.dtype) -> torch.Tensor:
        pos = torch.arange(n)
        return table[:, (pos.unsqueeze(0) - pos.unsqueeze(1)) + reach].to(dtype)

    return bias
