"""Length buckets for backends that run padded batches (ONNX Runtime, transformers).

Padding a whole batch to its longest input wastes most of the work on mixed lengths (a batch of
32 in arrival order carries about 2.5x its real tokens), so such a backend sorts a batch by
length and cuts it into buckets whose padded cost, plus a fixed per-call cost, is the least.
"""

from __future__ import annotations

import numpy as np

from vectorpress.types import Batch


def octave_bucket(n: int, steps: int, least: int = 1) -> int:
    """`n` rounded up to one of `steps` sizes per power of two (a step of at least `least`):
    a bounded set of shapes, at most 1/steps of padding."""
    step = max(least, (1 << (max(n, 1).bit_length() - 1)) // steps)
    return -(-n // step) * step


# What one extra forward call costs, in padded tokens: the per-call overhead of ONNX Runtime or
# of transformers' modules on a CPU is a few hundred microseconds, about the time of this many
# tokens of a small encoder.
CALL_COST_TOKENS = 64


def buckets(
    lengths: list[int], call_cost: int = CALL_COST_TOKENS, max_tokens: int | None = None
) -> list[list[int]]:
    """Indices grouped so that sum(max length x count) + call_cost x groups is the least.

    Groups are contiguous runs of the inputs sorted by length, so the split points can be
    searched over distinct lengths only: an exact dynamic program in O(distinct^2). With
    `max_tokens`, a group whose padded tokens exceed it is then cut into several of at most
    that many (or of one input, where one alone is longer).
    """
    if len(lengths) < 2:  # a query alone, the commonest batch: nothing to search
        return [list(range(len(lengths)))] if lengths else []
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    # Runs of equal length: a group never splits one.
    runs: list[tuple[int, int]] = []  # (length, end position in order)
    for pos, i in enumerate(order):
        if runs and runs[-1][0] == lengths[i]:
            runs[-1] = (lengths[i], pos + 1)
        else:
            runs.append((lengths[i], pos + 1))
    n = len(runs)
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        length, end = runs[j - 1]
        for i in range(j):
            start = runs[i - 1][1] if i else 0
            cost = best[i] + length * (end - start) + call_cost
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups: list[list[int]] = []
    j = n
    while j > 0:
        i = cut[j]
        start = runs[i - 1][1] if i else 0
        groups.append(order[start : runs[j - 1][1]])
        j = i
    groups.reverse()
    if max_tokens is None:
        return groups
    passes: list[list[int]] = []
    for group in groups:
        rows = max(1, max_tokens // max(lengths[i] for i in group))
        passes += [group[k : k + rows] for k in range(0, len(group), rows)]
    return passes


def padded_inputs(
    batch: Batch, group: list[int], pad_id: int = 0, token_types: bool = True
) -> dict[str, np.ndarray]:
    """The inputs of `group`'s texts, padded on the right to the longest of them: every input
    an encoder may take (the caller keeps those its model takes); token types all 0 unless
    `token_types` (see ModelSpec.has_token_types); the attention mask covers each text's key
    length (`Batch.key_lengths`)."""
    cu = batch.cu_seqlens
    width = max(int(cu[i + 1] - cu[i]) for i in group)
    ids = np.full((len(group), width), pad_id, dtype=np.int64)
    types = np.zeros((len(group), width), dtype=np.int64)
    mask = np.zeros((len(group), width), dtype=np.int64)
    positions = np.zeros((len(group), width), dtype=np.int64)
    for row, i in enumerate(group):
        s, e = int(cu[i]), int(cu[i + 1])
        ids[row, : e - s] = batch.input_ids[s:e]
        if token_types:
            types[row, : e - s] = batch.token_type_ids[s:e]
        positions[row, : e - s] = batch.position_ids[s:e]
        # A padded graph's key mask: the tokens past a sequence's key length (ColBERT's
        # held-out query expansion) are still computed, but nothing attends to them.
        keys = e - s if batch.key_lengths is None else int(batch.key_lengths[i])
        mask[row, :keys] = 1
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": types,
        "position_ids": positions,
    }
