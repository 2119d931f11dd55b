"""Length buckets for padded backends: every input once, under the budget, cheaper than one
padded batch."""

from __future__ import annotations

import random

import numpy as np

from vectorpress.backends.common.buckets import buckets, octave_bucket, padded_inputs
from vectorpress.types import Batch


def test_buckets_cover_every_input_once_and_beat_one_padded_batch() -> None:
    rng = random.Random(0)
    for _ in range(50):
        lengths = [rng.choice([rng.randint(3, 16), rng.randint(30, 120), 256]) for _ in range(48)]
        groups = buckets(lengths)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        cost = sum(max(lengths[i] for i in g) * len(g) + 64 for g in groups)
        assert cost <= max(lengths) * len(lengths) + 64
        assert cost <= sum(lengths) + 64 * len(set(lengths))
    assert buckets([]) == []
    assert buckets([7, 7, 7]) == [[0, 1, 2]]


def test_passes_keep_under_their_token_budget() -> None:
    rng = random.Random(1)
    for _ in range(50):
        lengths = [rng.choice([rng.randint(3, 16), rng.randint(30, 120), 256]) for _ in range(96)]
        groups = buckets(lengths, max_tokens=1024)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        assert all(max(lengths[i] for i in g) * len(g) <= 1024 for g in groups)
    # One input longer than the budget runs alone.
    assert buckets([300, 300, 5], max_tokens=256) == [[2], [0], [1]]


def test_padded_inputs_hold_out_what_a_sequence_does_not_attend_to() -> None:
    """ColBERT's held-out query expansion: the rows stay, the key mask stops at key_lengths."""
    cu = np.array([0, 5, 7], dtype=np.int32)
    batch = Batch(
        input_ids=np.arange(1, 8, dtype=np.int64),
        token_type_ids=np.zeros(7, dtype=np.int64),
        position_ids=np.array([0, 1, 2, 3, 4, 0, 1], dtype=np.int64),
        cu_seqlens=cu,
        max_seqlen=5,
        pooled_indices=(),
        raw_indices=(),
        key_lengths=np.array([3, 2], dtype=np.int32),
    )
    inputs = padded_inputs(batch, [0, 1])
    assert inputs["input_ids"].tolist() == [[1, 2, 3, 4, 5], [6, 7, 0, 0, 0]]
    assert inputs["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]]
    whole = padded_inputs(Batch(**{**batch.__dict__, "key_lengths": None}), [0, 1])
    assert whole["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]


def test_octave_buckets_pad_at_most_one_step_and_keep_few_shapes() -> None:
    for steps, least in ((4, 64), (8, 1)):
        sizes = {octave_bucket(n, steps, least) for n in range(1, 16_385)}
        for n in range(1, 16_385):
            got = octave_bucket(n, steps, least)
            assert n <= got <= max(n + least - 1, n + n // steps)
        # `steps` sizes per power of two above the least step's range.
        assert len([s for s in sizes if 8192 < s <= 16_384]) == steps
    assert octave_bucket(65, 4, 64) == 128 and octave_bucket(300, 4, 64) == 320
