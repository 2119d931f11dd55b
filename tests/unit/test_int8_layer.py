"""One int8 linear layer, on each GEMM it holds (fbgemm's, oneDNN's): exact per-row
independence, accuracy, no clipping below its calibrated range, and the two GEMMs' agreement."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import torch

from tests.helpers.cpu import needs_fbgemm
from vectorpress.backends.common.calibration import weight_levels
from vectorpress.backends.torch.int8 import Int8Weights, onednn_int8_missing

# Each test on both GEMMs where this torch build has oneDNN's int8 linear (False: fbgemm's).
ON_ONEDNN = [
    False,
    pytest.param(
        True,
        marks=pytest.mark.skipif(
            onednn_int8_missing() is not None, reason=str(onednn_int8_missing())
        ),
    ),
]


def _cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.cosine_similarity(a, b, dim=1)


@needs_fbgemm
@pytest.mark.parametrize("onednn", ON_ONEDNN)
@pytest.mark.parametrize("low", [1.0, 0.8, 0.3])
def test_rows_are_independent_and_close_to_float32(low: float, onednn: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 384, generator=gen)
    smooth = torch.rand(384, generator=gen) + 0.5
    layer = Int8Weights.of(weight, smooth, low)
    # One-sided rows, as after GELU, and symmetric ones.
    x = torch.cat(
        [torch.randn(10, 384, generator=gen).clamp_min(-0.2), torch.randn(10, 384, generator=gen)]
    )
    assert "oneDNN" in layer.kernels or not onednn
    together = layer(x, onednn=onednn)
    alone = torch.cat([layer(x[i : i + 1], onednn=onednn) for i in range(len(x))])
    assert torch.equal(together, alone)
    assert _cosines(together, x @ weight.T).min() > 0.999


@needs_fbgemm
@pytest.mark.parametrize("onednn", ON_ONEDNN)
def test_a_row_below_the_calibrated_range_is_scaled_not_clipped(onednn: bool) -> None:
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(64, 128, generator=gen)
    layer = Int8Weights.of(weight, torch.ones(128), low=0.2)
    x = torch.randn(3, 128, generator=gen)
    x[1] = -x[1].abs() * 5  # all negative: far outside [-0.2, 1] when scaled by its max
    y = layer(x, onednn=onednn)
    assert _cosines(y, x @ weight.T).min() > 0.999


@needs_fbgemm
@pytest.mark.parametrize("onednn", ON_ONEDNN)
def test_bias_and_a_shared_workspace_leave_each_layer_its_own_result(onednn: bool) -> None:
    gen = torch.Generator().manual_seed(2)
    wide = Int8Weights.of(torch.randn(48, 256, generator=gen), torch.ones(256))
    narrow = Int8Weights.of(torch.randn(256, 32, generator=gen), torch.ones(32))
    bias = torch.randn(48, generator=gen)
    x, h = torch.randn(7, 256, generator=gen), torch.randn(300, 32, generator=gen)
    with torch.inference_mode():  # the buffer made there serves outside it too
        narrow(h, onednn=onednn)
    first = wide(x, bias, onednn=onednn)
    narrow(h, onednn=onednn)  # a larger input through the same per-thread buffer in between
    assert torch.equal(wide(x, bias, onednn=onednn), first)
    torch.testing.assert_close(first, wide(x, onednn=onednn) + bias)
    results: list[torch.Tensor] = []
    thread = threading.Thread(target=lambda: results.append(wide(x, bias, onednn=onednn)))
    thread.start()
    thread.join()
    assert torch.equal(results[0], first)


@needs_fbgemm
@pytest.mark.skipif(onednn_int8_missing() is not None, reason=str(onednn_int8_missing()))
def test_the_two_gemms_agree_and_start_up_keeps_one() -> None:
    gen = torch.Generator().manual_seed(3)
    layer = Int8Weights.of(
        torch.randn(200, 384, generator=gen), torch.rand(384, generator=gen) + 0.5, 0.6
    )
    assert layer.kernels == ("fbgemm", "oneDNN")
    x, bias = torch.randn(2000, 384, generator=gen), torch.randn(200, generator=gen)
    # The same u8 rows (oneDNN's from the kernel that scales them, fbgemm's from its own
    # quantization of the float32 rows) and int32 sums: only the float32 outputs' last bits may
    # differ. A u8 value apart anywhere moves its row's outputs by some 1e-3.
    torch.testing.assert_close(layer(x, bias, onednn=True), layer(x, bias, onednn=False))
    on_onednn, on_fbgemm = layer.keep(True), layer.keep(False)
    assert on_onednn.kernels == ("oneDNN",) and on_fbgemm.kernels == ("fbgemm",)
    # A layer asked for the GEMM it no longer holds runs the one it has.
    assert torch.equal(on_onednn(x, bias, onednn=False), layer(x, bias, onednn=True))
    assert torch.equal(on_fbgemm(x, bias, onednn=True), layer(x, bias, onednn=False))


@pytest.mark.parametrize(("vnni", "levels"), [(True, 127), (False, 63), (None, 63)])
def test_weights_keep_8_bits_only_where_the_cpu_sums_without_saturating(
    monkeypatch: pytest.MonkeyPatch, vnni: bool | None, levels: int
) -> None:
    if vnni is None:
        monkeypatch.delattr(torch.cpu, "_is_vnni_supported", raising=False)
    else:
        monkeypatch.setattr(torch.cpu, "_is_vnni_supported", lambda: vnni, raising=False)
    assert weight_levels() == levels


_SATURATING = """
import dataclasses, torch
import vectorpress.backends.torch.int8 as int8
gen = torch.Generator().manual_seed(4)
weight = torch.randn(384, 1536, generator=gen) * 0.05
for levels in (127, 63):
    int8.WEIGHT_LEVELS = levels
    print(levels, ",".join(int8.Int8Weights.of(weight, torch.ones(1536), 0.5).kernels))
"""


@needs_fbgemm
@pytest.mark.skipif(onednn_int8_missing() is not None, reason=str(onednn_int8_missing()))
def test_a_onednn_gemm_that_disagrees_with_fbgemms_is_not_kept() -> None:
    # oneDNN held to AVX2 (no VNNI) sums pairs of u8 x s8 products in 16 bits with saturation:
    # 8-bit weights overflow there and its outputs part from fbgemm's, so each layer keeps
    # fbgemm alone; with the 7 bits such a CPU gets, the two agree and both are kept.
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    run = subprocess.run(
        [sys.executable, "-c", _SATURATING], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["127", "fbgemm", "63", "fbgemm,oneDNN"]
