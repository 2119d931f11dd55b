"""Pooling, written once, on packed hidden states `(total_tokens, hidden)`."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch

from vectorpress.backends.common.sequences import PackedSequences

# Up to this many rows (a short pass's), mean pooling runs on numpy: torch's calls right after
# a pass has streamed the weights through the caches cost about 0.1 ms more there
# (all-MiniLM-L6-v2's one-query embed in-process, docs/performance.md).
NUMPY_MEAN_ROWS = 64


class VocabHead(Protocol):
    """A masked-LM head in the two parts SPLADE pooling takes (the torch backend's MLMHead)."""

    vocab_size: int

    @property
    def bias(self) -> torch.Tensor | None: ...

    def transform(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def vocab_scores(self, x: torch.Tensor) -> torch.Tensor: ...


def pool(
    hidden: torch.Tensor, seqs: PackedSequences, method: str, which: list[int] | None = None
) -> torch.Tensor:
    """One vector per sequence in `which` (all by default): cls, mean or last_token.

    As few torch calls as the arithmetic allows: pooling runs right after a forward pass has
    streamed the weights through the caches, where each call costs several times its warm
    price (a short query's mean pooling on OpenVINO: 380 us with the indices built by torch
    calls, 190 us with them built in numpy; the sums are the same bit for bit).
    """
    which = list(range(seqs.size)) if which is None else which
    if method in ("cls", "last_token"):
        rows = [
            seqs.starts[i] + (seqs.lengths[i] - 1 if method == "last_token" else 0) for i in which
        ]
        return hidden[_index(rows, hidden.device)]
    if method == "mean":
        if (
            hidden.device.type == "cpu"
            and hidden.dtype == torch.float32
            and seqs.total <= NUMPY_MEAN_ROWS
            and all(seqs.lengths[i] for i in which)
        ):
            return torch.from_numpy(_mean_rows(hidden.detach().numpy(), seqs, which))
        # Every sequence summed, the chosen ones kept: a text's vector is the same bits whether
        # or not its batch holds entries that want no pooling.
        sums = torch.zeros(seqs.size, hidden.shape[1], dtype=torch.float32, device=hidden.device)
        sums.index_add_(0, seqs.segment_ids(), hidden.float())
        if len(which) != seqs.size:
            sums = sums[_index(which, hidden.device)]
        lengths = np.asarray([seqs.lengths[i] for i in which], dtype=np.float32)
        return sums.div_(_tensor(lengths, hidden.device).unsqueeze(1)).to(hidden.dtype)
    raise ValueError(f"unknown pooling {method}")


def _mean_rows(hidden: np.ndarray, seqs: PackedSequences, which: list[int]) -> np.ndarray:
    """The mean of each sequence in `which`, its rows added one after another in float32 as
    `index_add_` adds them (the same bits), in one numpy call a sequence."""
    out = np.empty((len(which), hidden.shape[1]), dtype=np.float32)
    for row, i in enumerate(which):
        rows = hidden[seqs.starts[i] : seqs.starts[i] + seqs.lengths[i]]
        # accumulate's running sums are the in-order ones; adding +0.0 turns a sum of -0.0s
        # into the +0.0 that index_add_ gets by starting from zeros.
        np.add(np.add.accumulate(rows, axis=0)[-1], np.float32(0.0), out=out[row])
    out /= np.asarray([seqs.lengths[i] for i in which], dtype=np.float32)[:, None]
    return out


def _tensor(values: np.ndarray, device: torch.device) -> torch.Tensor:
    """`values` as a tensor on `device`, without a copy on the CPU."""
    out = torch.from_numpy(values)
    return out if device.type == "cpu" else out.to(device)


def _index(rows: list[int], device: torch.device) -> torch.Tensor:
    return _tensor(np.asarray(rows, dtype=np.int64), device)


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


# Scores per block of SPLADE pooling: 128 rows of a 30,522-token vocabulary, 16 MB in float32,
# within the L3 cache that the max reads them back from. On SPLADE-tiny blocks of 64-256 rows
# ran level, 512 rows 0.7x.
SPLADE_BLOCK_SCORES = 128 * 32768


def splade_block_rows(vocab: int) -> int:
    """Rows per block for a vocabulary of `vocab`: a multiple of 16, at least 16."""
    return max(16, SPLADE_BLOCK_SCORES // max(vocab, 1) // 16 * 16)


def rows_of(
    hidden: torch.Tensor, seqs: PackedSequences, which: list[int]
) -> tuple[torch.Tensor, list[int]]:
    """The rows of the sequences in `which`, one after another, and their lengths."""
    lengths = [seqs.lengths[i] for i in which]
    if which == list(range(seqs.size)):
        return hidden, lengths
    index = torch.cat(
        [torch.arange(seqs.starts[i], seqs.starts[i] + seqs.lengths[i]) for i in which]
    )
    return hidden[index.to(hidden.device)], lengths


def splade_pool(
    scores: Callable[[torch.Tensor], torch.Tensor],
    rows: torch.Tensor,
    lengths: list[int],
    block_rows: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """For each sequence (`lengths[i]` rows of `rows`, one after another), the max over its
    tokens of log(1 + relu(scores(token) + bias)).

    log(1 + relu(x)) never decreases and the bias shifts every token's score alike, so the max
    is taken over the bare scores and the rest applied once per sequence: vocabulary-sized
    elementwise work per text, not per token. `rows` go through `scores` in blocks of
    `block_rows` across sequence bounds: one GEMM for many short texts, and never a whole
    batch's tokens x vocabulary at once.
    """
    total = rows.shape[0]
    bounds = [0, *itertools.accumulate(lengths)]
    assert bounds[-1] == total, (bounds[-1], total)
    best: torch.Tensor | None = None
    seq = 0
    for start in range(0, total, block_rows):
        end = min(start + block_rows, total)
        block = scores(rows[start:end])
        if best is None:
            best = block.new_full((len(lengths), block.shape[1]), float("-inf"))
        while seq < len(lengths) and bounds[seq] < end:
            lo, hi = max(bounds[seq], start), min(bounds[seq + 1], end)
            if hi > lo:
                torch.maximum(best[seq], block[lo - start : hi - start].amax(0), out=best[seq])
            if bounds[seq + 1] > end:
                break  # the sequence goes on in the next block
            seq += 1
    assert best is not None, "no tokens to pool"
    if bias is not None:
        best += bias
    return torch.log1p(torch.relu(best.float()))


def splade_from_logits(logits: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """SPLADE vectors from a masked-LM's own logits (its bias included) for each sequence's
    tokens, `lengths[i]` rows of `logits` one after another: for backends that get them from
    the model whole (transformers, an ONNX graph ending in the head)."""
    return splade_pool(lambda x: x, logits, lengths, splade_block_rows(logits.shape[1]))


def splade_vectors(
    head: VocabHead, hidden: torch.Tensor, seqs: PackedSequences, which: list[int]
) -> torch.Tensor:
    """SPLADE vectors of the sequences in `which` from the encoder's packed hidden states."""
    rows, lengths = rows_of(hidden, seqs, which)
    blocks = splade_block_rows(head.vocab_size)
    return splade_pool(head.vocab_scores, head.transform(rows), lengths, blocks, head.bias)
