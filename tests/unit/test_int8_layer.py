"""One int8 linear layer: exact per-row independence, accuracy, and no clipping below its
calibrated range."""

from __future__ import annotations

import pytest
import torch

from vectorpress.backends.torch.int8 import Int8Weights


def _cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.cosine_similarity(a, b, dim=1)


@pytest.mark.parametrize("low", [1.0, 0.8, 0.3])
def test_rows_are_independent_and_close_to_float32(low: float) -> None:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 384, generator=gen)
    smooth = torch.rand(384, generator=gen) + 0.5
    layer = Int8Weights.of(weight, smooth, low)
    # One-sided rows, as after GELU, and symmetric ones.
    x = torch.cat(
        [torch.randn(10, 384, generator=gen).clamp_min(-0.2), torch.randn(10, 384, generator=gen)]
    )
    together = layer(x)
    alone = torch.cat([layer(x[i : i + 1]) for i in range(len(x))])
    assert torch.equal(together, alone)
    assert _cosines(together, x @ weight.T).min() > 0.999


def test_a_row_below_the_calibrated_range_is_scaled_not_clipped() -> None:
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(64, 128, generator=gen)
    layer = Int8Weights.of(weight, torch.ones(128), low=0.2)
    x = torch.randn(3, 128, generator=gen)
    x[1] = -x[1].abs() * 5  # all negative: far outside [-0.2, 1] when scaled by its max
    y = layer(x)
    assert _cosines(y, x @ weight.T).min() > 0.999
