"""The compiled ops of a float32 model's CPU passes (backends/torch/f32_kernels.py): attention
against one explicit softmax per sequence in float64, held to the error torch's own float32
attention makes there, on every layout the layers hand it; a sequence's values independent of
its pass; filler rows; the calls it leaves to the grouped path; the scratch kept from call to
call; the residual add and LayerNorm against torch's; and a float32 backend that takes them
and keeps its vectors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from bench.corpus import corpus
from torch import nn

from tests.helpers.attention import packed, reference_attention, relative_bias
from tests.helpers.batches import pooled, tokenized_batches
from tests.helpers.cpu import needs_kernel
from tests.helpers.kernels import run_cache
from tests.helpers.reference import assert_close_vectors
from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.torch.attention import ScoreBias, packed_attention
from vectorpress.backends.torch.backend import TorchBackend
from vectorpress.backends.torch.compiled_ops import AddNorm
from vectorpress.backends.torch.cpu_kernels import NONE, CpuKernels, add_norm, cpu_kernels
from vectorpress.backends.torch.f32_kernels import FloatAttention, f32_kernels
from vectorpress.model_spec import load_model_spec
from vectorpress.settings import ModelSettings

pytestmark = needs_kernel

# Around the kernel's blocks: 16 queries and keys, 4 query rows by 64 keys, 8 rows in P V.
LENGTHS = [1, 3, 4, 5, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 100, 300]
HEADS = 3


@pytest.fixture(scope="module")
def kernels() -> CpuKernels:
    return f32_kernels(torch.float32, run_cache())


@pytest.fixture(scope="module")
def kernel(kernels: CpuKernels) -> FloatAttention:
    assert isinstance(kernels.attention, FloatAttention)
    return kernels.attention


def _qkv(total: int, dim: int, seed: int = 0, heads: int = HEADS) -> tuple[torch.Tensor, ...]:
    """q, k and v as a fused projection's output leaves them: views of one (total, 3, heads,
    dim) tensor, a row apart by 3 * heads * dim."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(total, 3, heads, dim, generator=gen) * 2).unbind(1)


def _error(
    got: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seqs: PackedSequences,
    scale: float | None = None,
    bias: ScoreBias | None = None,
) -> tuple[float, float]:
    """The largest difference to float64 attention of `got` and of torch's grouped calls (on
    these inputs 6e-6 to 5e-5, by head size and scale; the kernel's 0.84-1.11x torch's)."""
    exact = reference_attention(q, k, v, seqs, scale=scale, bias=bias, precision=torch.float64)
    torchs = packed_attention(q, k, v, seqs, scale=scale, bias=bias)
    return (got.double() - exact).abs().max().item(), (torchs.double() - exact).abs().max().item()


@pytest.mark.parametrize("dim", [16, 32, 64, 128])
def test_matches_float64_as_closely_as_torchs_attention(kernel: FloatAttention, dim: int) -> None:
    seqs = packed(LENGTHS)
    q, k, v = _qkv(seqs.total, dim)
    # Rotated q and k are tensors of their own, v still a view: three strides.
    layouts = {"fused": (q, k, v), "separate": (q.contiguous(), k.contiguous(), v)}
    for name, (qs, ks, vs) in layouts.items():
        for scale in (None, 0.3):
            got = kernel(qs, ks, vs, seqs, scale)
            assert got is not None and got.dtype == torch.float32
            ours, torchs = _error(got, qs, ks, vs, seqs, scale)
            assert ours <= 1.5 * torchs, (name, ours, torchs)


@pytest.mark.parametrize("dim", [32, 64])
def test_a_relative_position_bias(kernel: FloatAttention, dim: int) -> None:
    seqs = packed(LENGTHS)
    q, k, v = _qkv(seqs.total, dim, seed=2)
    bias = relative_bias(HEADS)
    got = kernel(q, k, v, seqs, None, bias)
    assert got is not None
    ours, torchs = _error(got, q, k, v, seqs, bias=bias)
    assert ours <= 1.5 * torchs, (ours, torchs)
    # Each sequence reads the top-left corner of the longest one's bias.
    rows = slice(seqs.starts[-2], seqs.starts[-2] + seqs.lengths[-2])
    alone = kernel(q[rows], k[rows], v[rows], packed([seqs.lengths[-2]]), None, bias)
    assert alone is not None and torch.equal(alone, got[rows])


def test_a_sequence_gets_the_same_values_in_any_pass(kernel: FloatAttention) -> None:
    seqs = packed(LENGTHS)
    q, k, v = _qkv(seqs.total, 32)
    together = kernel(q, k, v, seqs)
    assert together is not None
    for start, n in zip(seqs.starts, seqs.lengths, strict=True):
        rows = slice(start, start + n)
        alone = kernel(q[rows], k[rows], v[rows], packed([n]))
        assert alone is not None
        assert torch.equal(alone, together[rows]), n


def test_filler_rows_are_zeros_and_change_nothing(kernel: FloatAttention) -> None:
    seqs = packed([40, 7])
    q, k, v = _qkv(seqs.total + 9, 32)
    padded = seqs.with_filler(seqs.total + 9)
    got = kernel(q, k, v, padded)
    want = kernel(q[: seqs.total], k[: seqs.total], v[: seqs.total], seqs)
    assert got is not None and want is not None
    assert torch.equal(got[: seqs.total], want)
    assert not got[seqs.total :].any()


def test_a_threads_scratch_grows_with_the_longest_text(kernel: FloatAttention) -> None:
    """Each thread keeps its scratch from call to call (`scratch` in short_kernel.c), sized by
    the pass's longest text and head size: a long pass of wide heads, short ones, then the long
    one again."""
    long = packed([900, 200, 700])
    lq, lk, lv = _qkv(long.total, 128, seed=3, heads=4)
    small = packed(LENGTHS)
    q, k, v = _qkv(small.total, 32)
    first = kernel(lq, lk, lv, long)
    assert first is not None
    ours, torchs = _error(first, lq, lk, lv, long)
    assert ours <= 1.5 * torchs
    for _ in range(2):
        got = kernel(q, k, v, small)
        assert got is not None
        ours, torchs = _error(got, q, k, v, small)
        assert ours <= 1.5 * torchs
    again = kernel(lq, lk, lv, long)
    assert again is not None and torch.equal(again, first)


def test_calls_it_does_not_fit_take_the_grouped_path(kernel: FloatAttention) -> None:
    seqs = packed([20, 9])
    q, k, v = _qkv(seqs.total, 32)
    held_out = PackedSequences(seqs.cu_seqlens, 20, key_lengths=[12, 9])
    tiny = packed([3] * 1300)
    tq, tk, tv = _qkv(tiny.total, 32)
    cases = {
        "causal": ((q, k, v, seqs), {"causal": True}),
        "window": ((q, k, v, seqs), {"window": 8}),
        "fewer key heads": ((q, k[:, :1], v[:, :1], seqs), {}),
        "bfloat16": ((q.bfloat16(), k.bfloat16(), v.bfloat16(), seqs), {}),
        "48 dimensions": ((*_qkv(seqs.total, 48), seqs), {}),
        "held-out keys": ((q, k, v, held_out), {}),
        "1,300 texts of 3 tokens": ((tq, tk, tv, tiny), {}),
    }
    for name, (args, options) in cases.items():
        with cpu_kernels(CpuKernels(attention=kernel)):
            got = packed_attention(*args, **options)
        assert torch.equal(got, packed_attention(*args, **options)), name
    assert kernel(q.bfloat16(), k.bfloat16(), v.bfloat16(), seqs) is None
    assert kernel(q, k, v, held_out) is None
    assert kernel(tq, tk, tv, tiny) is None
    # Four tokens a text lay out 4x their rows, which the kernel still takes.
    fours = packed([4] * 1000)
    assert kernel(*_qkv(fours.total, 32), fours) is not None
    on_kernel = kernel(q, k, v, seqs)
    assert on_kernel is not None
    with cpu_kernels(CpuKernels(attention=kernel)):
        assert torch.equal(packed_attention(q, k, v, seqs), on_kernel)


def _layer_norm(n: int, seed: int = 0) -> nn.LayerNorm:
    gen = torch.Generator().manual_seed(seed)
    norm = nn.LayerNorm(n, eps=1e-12)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.2 * torch.randn(n, generator=gen))
        norm.bias.copy_(0.1 * torch.randn(n, generator=gen))
    return norm


@pytest.mark.parametrize("n", [384, 100])
def test_the_residual_step_gives_torchs_values(kernels: CpuKernels, n: int) -> None:
    assert isinstance(kernels.add_norm, AddNorm)
    gen = torch.Generator().manual_seed(1)
    a = 3 * torch.randn(300, n, generator=gen)
    b = 3 * torch.randn(300, n, generator=gen)
    norm = _layer_norm(n)
    with torch.inference_mode():
        got = kernels.add_norm(a.clone(), b, norm)
        want = norm(a.clone().add_(b))
    assert got is not None and got.dtype == torch.float32
    # LayerNorm's moments summed in another order: a few float32 steps at most.
    torch.testing.assert_close(got, want, rtol=0, atol=4e-6)


def test_residual_steps_it_does_not_fit_take_torchs(kernels: CpuKernels) -> None:
    a = torch.randn(8, 64)
    b = torch.randn(8, 64)
    norm = _layer_norm(64)
    cases = {
        "bfloat16": (a.bfloat16(), b.bfloat16(), norm.bfloat16()),
        "no bias": (a, b, nn.LayerNorm(64, bias=False)),
        "not a LayerNorm": (a, b, nn.Identity()),
        "strided": (a.t().contiguous().t(), b, _layer_norm(64)),
    }
    assert kernels.add_norm is not None
    with torch.inference_mode():
        for name, (x, y, layer) in cases.items():
            assert kernels.add_norm(x.clone(), y, layer) is None, name
            with cpu_kernels(kernels):
                got = add_norm(x.clone(), y, layer)
            assert torch.equal(got, layer(x.clone().add_(y))), name


def test_a_float32_backend_takes_them_and_keeps_its_vectors(minilm: Path) -> None:
    spec = load_model_spec(minilm, ModelSettings(str(minilm)))
    backend = TorchBackend(spec, "cpu", "float32")
    kernels = backend.passes.kernels
    assert isinstance(kernels.attention, FloatAttention)
    assert isinstance(kernels.add_norm, AddNorm)
    # Longer than the short passes, which run on the short-pass kernel or natively.
    batches = tokenized_batches(minilm, corpus(200, seed=1)[::4], 16)
    on_kernel = pooled(backend, batches)
    backend.passes.kernels = NONE
    native = pooled(backend, batches)
    assert not np.array_equal(on_kernel, native), "the kernels never ran"
    assert_close_vectors(on_kernel, native, min_cos=0.999999, what="kernels vs torch's ops")
    assert np.abs(on_kernel - native).max() < 1e-5
