"""Length buckets for padded backends: every input once, under the budget, cheaper than one
padded batch."""

from __future__ import annotations

import random

from vectorpress.backends.common.buckets import buckets


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
