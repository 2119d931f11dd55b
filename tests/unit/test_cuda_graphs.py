"""CUDA graphs' buckets and pooling (`backends/torch/cuda_graphs.py`), checked on any machine:
a wrong filler or pooled row would only show on a GPU as a wrong vector."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from vectorpress.backends.common.pooling import pool
from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.torch.cuda_graphs import pool_all, shape_for, token_bucket


def test_token_buckets_are_few_and_pad_at_most_a_quarter_or_63() -> None:
    buckets = {token_bucket(t) for t in range(1, 16385)}
    assert len(buckets) <= 32
    for t in range(1, 16385):
        b = token_bucket(t)
        assert t <= b <= t + max(63, t // 4)


@pytest.mark.parametrize("seed", range(5))
def test_fillers_fill_the_bucket_without_mixing_or_overlong_sequences(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(2000):
        n = rng.choice([1, 2, 5, 32, 100, 300, 1000])
        longest = rng.choice([1, 2, 16, 64, 512, 8192])
        lengths = [rng.randint(1, longest) for _ in range(n)]
        shape, fillers = shape_for(lengths)
        assert fillers, "no filler: the padding rows would join a real sequence"
        assert shape.tokens == sum(lengths) + sum(fillers)
        assert shape.sequences == n + len(fillers)
        assert shape.sequences & (shape.sequences - 1) == 0
        assert max(lengths) <= shape.longest < 2 * max(max(lengths), 16)
        assert all(1 <= f <= shape.longest for f in fillers)
        assert shape.tokens == token_bucket(shape.tokens)


@pytest.mark.parametrize("method", ["mean", "cls", "last_token"])
def test_pooling_from_device_bounds_equals_pool(method: str) -> None:
    """What a graph pools from its bounds alone is `pool` over every sequence (on the CPU here:
    the same torch calls a graph captures)."""
    gen = torch.Generator().manual_seed(1)
    lengths = [3, 1, 17, 8, 1, 40]
    bounds = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    for dtype in (torch.float32, torch.bfloat16):
        hidden = torch.randn(sum(lengths), 24, generator=gen).to(dtype)
        want = pool(hidden, PackedSequences(bounds, max(lengths)), method)
        got = pool_all(hidden, bounds, method)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6 if dtype == torch.float32 else 0)
