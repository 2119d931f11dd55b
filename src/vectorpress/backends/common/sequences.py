"""Sequence bounds of a packed batch, `(total_tokens, ...)` tensors cut by `cu_seqlens`.

Every backend keeps a batch packed outside its forward pass (pooling, SPLADE, raw outputs), so
the bounds and their length groups are computed once here, for every layer and every backend.
"""

from __future__ import annotations

import copy
import functools
import itertools
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class LengthGroup:
    length: int
    count: int
    index: torch.Tensor | None
    """Token positions of the group's sequences, concatenated; None when they lie side by side
    (a single sequence, or a run of them in a batch sorted by length)."""
    start: int
    """Start of the group's first sequence when they lie side by side."""
    filler: bool = False
    """Padding rows (`PackedSequences.with_filler`): no attention, zeros."""
    keys: torch.Tensor | None = None
    """`(count, 1, 1, length)` bool, the keys each sequence's tokens may attend to, where some
    are held out (a ColBERT query's expansion tokens); None when all are attended."""


class PackedSequences:
    """Sequence bounds of one batch, with the length groups computed once for every layer."""

    def __init__(
        self,
        cu_seqlens: torch.Tensor,
        max_seqlen: int,
        varlen: bool = False,
        key_lengths: list[int] | None = None,
    ) -> None:
        self.cu_seqlens = cu_seqlens
        self.max_seqlen = max_seqlen
        bounds = cu_seqlens.tolist()
        self.starts = bounds[:-1]
        self.lengths = [b - a for a, b in itertools.pairwise(bounds)]
        self.total = bounds[-1]
        # Sequence i's tokens attend to its first key_lengths[i] tokens only; None: to all.
        if key_lengths is not None and key_lengths == self.lengths:
            key_lengths = None
        self.key_lengths = key_lengths
        # Attention through varlen_attn, decided once at start-up (see `varlen_usable`); it
        # has no key masks.
        self.varlen = varlen and key_lengths is None
        # Rows of filler after the sequences (`with_filler`), the last sequence.
        self.filler = 0

    @functools.cached_property
    def groups(self) -> list[LengthGroup]:
        """The sequences by length, for attention: only the torch backend's layers read them,
        so they are computed on first use (the ONNX and OpenVINO backends pool without)."""
        by_length: dict[int, list[int]] = defaultdict(list)
        for i, length in enumerate(self.lengths):
            by_length[length].append(i)
        device = self.cu_seqlens.device
        groups: list[LengthGroup] = []
        for length, members in by_length.items():
            keys = None
            if self.key_lengths is not None and any(self.key_lengths[i] < length for i in members):
                limits = torch.tensor([self.key_lengths[i] for i in members], device=device)
                keys = (torch.arange(length, device=device) < limits.unsqueeze(1))[:, None, None]
            first = members[0]
            if members[-1] - first == len(members) - 1:
                # Side by side: attention reads them as one view, no gather.
                groups.append(
                    LengthGroup(length, len(members), None, self.starts[first], keys=keys)
                )
            else:
                base = torch.tensor([self.starts[i] for i in members], device=device).unsqueeze(1)
                index = (base + torch.arange(length, device=device)).reshape(-1)
                groups.append(LengthGroup(length, len(members), index, -1, keys=keys))
        return groups

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
        out.filler = pad
        out.groups = [*self.groups, LengthGroup(pad, 1, None, self.total, filler=True)]
        return out

    def longest_first(self) -> tuple[torch.Tensor, PackedSequences] | None:
        """The token order that puts these sequences longest first (equal lengths in their
        order), and the bounds in that order; None when they already are.

        Sequences of one length then lie side by side, so that attention takes each length as
        one view instead of gathering its rows in every layer, and a batch cut into passes
        puts similar lengths together (fewer, larger attention calls).
        """
        lengths = self.lengths
        order = sorted(range(self.size), key=lambda i: -lengths[i])
        if all(a == i for i, a in enumerate(order)):
            return None
        sorted_lengths = [lengths[i] for i in order]
        new_starts = list(itertools.accumulate(sorted_lengths, initial=0))
        shift = [self.starts[i] - new_starts[j] for j, i in enumerate(order)]
        device = self.cu_seqlens.device
        counts = torch.tensor(sorted_lengths, device=device)
        tokens = torch.arange(self.total, device=device) + torch.repeat_interleave(
            torch.tensor(shift, device=device), counts
        )
        keys = None if self.key_lengths is None else [self.key_lengths[i] for i in order]
        bounds = torch.tensor(new_starts, dtype=self.cu_seqlens.dtype, device=device)
        return tokens, PackedSequences(bounds, self.max_seqlen, self.varlen, keys)

    def segment_ids(self) -> torch.Tensor:
        """(total_tokens,) index of the sequence each token belongs to."""
        ids = torch.from_numpy(np.repeat(np.arange(self.size, dtype=np.int64), self.lengths))
        device = self.cu_seqlens.device
        return ids if device.type == "cpu" else ids.to(device)
