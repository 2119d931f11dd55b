"""Sequence bounds of a packed batch, `(total_tokens, ...)` tensors cut by `cu_seqlens`.

Every backend keeps a batch packed outside its forward pass (pooling, SPLADE, raw outputs), so
the bounds and their length groups are computed once here, for every layer and every backend.
"""

from __future__ import annotations

import copy
import itertools
from collections import defaultdict
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LengthGroup:
    length: int
    count: int
    index: torch.Tensor | None
    """Token positions of the group's sequences, concatenated; None for a single sequence."""
    start: int
    """Start of the sequence when the group holds one."""
    filler: bool = False
    """Padding rows (`PackedSequences.with_filler`): no attention, zeros."""


class PackedSequences:
    """Sequence bounds of one batch, with the length groups computed once for every layer."""

    def __init__(self, cu_seqlens: torch.Tensor, max_seqlen: int, varlen: bool = False) -> None:
        self.cu_seqlens = cu_seqlens
        self.max_seqlen = max_seqlen
        # Attention through varlen_attn, decided once at start-up (see `varlen_usable`).
        self.varlen = varlen
        bounds = cu_seqlens.tolist()
        self.starts = bounds[:-1]
        self.lengths = [b - a for a, b in itertools.pairwise(bounds)]
        self.total = bounds[-1]
        by_length: dict[int, list[int]] = defaultdict(list)
        for start, length in zip(self.starts, self.lengths, strict=False):
            by_length[length].append(start)
        device = cu_seqlens.device
        groups = []
        for length, starts in by_length.items():
            if len(starts) == 1:
                groups.append(LengthGroup(length, 1, None, starts[0]))
            else:
                base = torch.tensor(starts, device=device).unsqueeze(1)
                index = (base + torch.arange(length, device=device)).reshape(-1)
                groups.append(LengthGroup(length, len(starts), index, -1))
        self.groups = groups

    @property
    def size(self) -> int:
        return len(self.lengths)

    def with_filler(self, rows: int) -> PackedSequences:
        """These sequences and one more of filler tokens after them, `rows` tokens in all.

        The filler is a sequence of its own, so attention never mixes it with real tokens, and
        its rows are dropped after the forward pass, so attention gives them zeros without a
        call; the length groups already computed are kept.
        """
        pad = rows - self.total
        out = copy.copy(self)
        out.cu_seqlens = torch.cat([self.cu_seqlens, self.cu_seqlens.new_tensor([rows])])
        out.max_seqlen = max(self.max_seqlen, pad)
        out.starts = [*self.starts, self.total]
        out.lengths = [*self.lengths, pad]
        out.total = rows
        out.groups = [*self.groups, LengthGroup(pad, 1, None, self.total, filler=True)]
        return out

    def segment_ids(self) -> torch.Tensor:
        """(total_tokens,) index of the sequence each token belongs to."""
        lengths = torch.tensor(self.lengths, device=self.cu_seqlens.device)
        return torch.repeat_interleave(torch.arange(self.size, device=lengths.device), lengths)
