"""The answer's last arithmetic: normalization as numpy's own norm gives it, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from vectorpress.core.postprocess import l2_normalize


@pytest.mark.parametrize("dim", [1, 7, 384, 768, 1024, 4096])
def test_l2_normalize_is_numpys_norm_bit_for_bit(dim: int) -> None:
    rng = np.random.default_rng(dim)
    for scale in (1e-4, 1.0, 1e4):
        v = (rng.standard_normal(dim) * scale).astype(np.float32)
        expected = v / float(np.linalg.norm(v))
        got = l2_normalize(v)
        assert got.dtype == np.float32
        assert np.array_equal(got, expected)


def test_l2_normalize_keeps_a_zero_vector_zero_and_leaves_its_input_alone() -> None:
    v = np.zeros(8, dtype=np.float32)
    out = l2_normalize(v)
    assert np.array_equal(out, v) and not np.isnan(out).any()
    out[0] = 1.0
    assert v[0] == 0.0
    half = np.arange(4, dtype=np.float16)
    assert l2_normalize(half).dtype == np.float32
