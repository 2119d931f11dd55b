"""Pooling, written once, on packed hidden states `(total_tokens, hidden)`."""

from __future__ import annotations

import numpy as np
import torch

from vectorpress.backends.torch.attention import PackedSequences


def pool(
    hidden: torch.Tensor, seqs: PackedSequences, method: str, which: list[int] | None = None
) -> torch.Tensor:
    """One vector per sequence in `which` (all by default): cls, mean or last_token."""
    which = list(range(seqs.size)) if which is None else which
    starts = torch.tensor([seqs.starts[i] for i in which], device=hidden.device)
    lengths = torch.tensor([seqs.lengths[i] for i in which], device=hidden.device)
    if method == "cls":
        return hidden[starts]
    if method == "last_token":
        return hidden[starts + lengths - 1]
    if method == "mean":
        if len(which) == seqs.size:
            segments = seqs.segment_ids()
            sums = torch.zeros(
                seqs.size, hidden.shape[1], dtype=torch.float32, device=hidden.device
            )
            sums.index_add_(0, segments, hidden.float())
        else:
            sums = torch.stack(
                [
                    hidden[s : s + n].float().sum(0)
                    for s, n in zip(starts.tolist(), lengths.tolist(), strict=False)
                ]
            )
        return (sums / lengths.unsqueeze(1).to(sums.dtype)).to(hidden.dtype)
    raise ValueError(f"unknown pooling {method}")


def last_non_pad_rows(
    input_ids: np.ndarray, seqs: PackedSequences, which: list[int], pad_token_id: int
) -> list[int]:
    """Row of each sequence's last token that is not `pad_token_id` (its last token if all are).

    This is the token transformers' decoder classifiers read: where the tokenizer appends an
    end-of-text token that doubles as the pad token (Qwen's <|endoftext|>), the classifier reads
    the token before it.
    """
    rows = []
    for i in which:
        start, n = seqs.starts[i], seqs.lengths[i]
        real = np.flatnonzero(input_ids[start : start + n] != pad_token_id)
        rows.append(start + int(real[-1]) if len(real) else start + n - 1)
    return rows


def splade_pool(
    logits_fn,
    hidden: torch.Tensor,
    seqs: PackedSequences,
    which: list[int],
) -> torch.Tensor:
    """max over tokens of log(1 + relu(MLM logits)), one sequence at a time.

    Vocabulary-sized logits for a whole batch would be tokens x 30k floats; per sequence they
    stay small.
    """
    out = []
    for i in which:
        s, n = seqs.starts[i], seqs.lengths[i]
        logits = logits_fn(hidden[s : s + n]).float()
        out.append(torch.log1p(torch.relu(logits)).amax(0))
    return torch.stack(out)
