"""The compiled ops of a bfloat16 model's CPU passes (backends/torch/bf16_kernels.py): attention
on AMX's tiles, on AVX512-BF16's dot products and in float32 on the widened rows (CPUs without
AMX), against one explicit
softmax per sequence (the reference) on every layout the layers hand it, a sequence's values
independent of its pass, filler rows, a layout too large to keep, the calls it leaves to the
grouped path; the residual add and LayerNorm against torch's; and a bfloat16 backend that takes
them without losing its accuracy."""

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
from vectorpress.backends.torch.attention import packed_attention
from vectorpress.backends.torch.backend import TorchBackend
from vectorpress.backends.torch.bf16_kernels import (
    AmxAttention,
    DotAttention,
    RoundedAttention,
    WidenedAttention,
    bf16_kernels,
)
from vectorpress.backends.torch.compiled_ops import AddNorm, KernelAttention
from vectorpress.backends.torch.cpu_kernels import NONE, CpuKernels, add_norm, cpu_kernels
from vectorpress.backends.torch.f32_kernels import FloatAttention
from vectorpress.backends.torch.short_kernel import load_library
from vectorpress.cpus import cpu_flags
from vectorpress.model_spec import load_model_spec
from vectorpress.settings import ModelSettings

pytestmark = needs_kernel

# Around the kernel's blocks: 16 queries, 32 keys.
LENGTHS = [1, 5, 15, 16, 17, 31, 32, 33, 64, 100, 300]
HEADS = 3


@pytest.fixture(scope="module")
def kernels() -> CpuKernels:
    return bf16_kernels(torch.bfloat16, run_cache())


@pytest.fixture(scope="module")
def amx(kernels: CpuKernels) -> AmxAttention:
    if "amx_bf16" not in cpu_flags():
        pytest.skip("this CPU has no AMX")
    assert isinstance(kernels.attention, AmxAttention)
    return kernels.attention


@pytest.fixture(scope="module", params=["amx", "dot", "widened"])
def kernel(request: pytest.FixtureRequest) -> KernelAttention:
    """Each bfloat16 attention kernel: AMX's where the CPU has it, the dot products' where it
    has AVX512-BF16, the widened one anywhere."""
    if request.param == "amx":
        found: KernelAttention = request.getfixturevalue("amx")
        return found
    if request.param == "dot" and "avx512_bf16" not in cpu_flags():
        pytest.skip("this CPU has no AVX512-BF16")
    lib = load_library(run_cache())
    assert lib is not None
    return DotAttention(lib) if request.param == "dot" else WidenedAttention(lib)


def _tolerance(kernel: KernelAttention) -> dict[str, float]:
    """How far a kernel's output may be from float32 attention on the same bfloat16 rows: AMX's
    and the dot products' round P to bfloat16 as ATen's flash kernel does; the widened one rounds
    its output only, so within one bfloat16 step (see also the share it rounds to the nearest
    value)."""
    if isinstance(kernel, (AmxAttention, DotAttention)):
        return {"atol": 1e-2, "rtol": 1.6e-2}
    return {"atol": 2**-20, "rtol": 2**-7}


def _qkv(total: int, dim: int, seed: int = 0, heads: int = HEADS) -> tuple[torch.Tensor, ...]:
    """q, k and v as a fused projection's output leaves them: views of one (total, 3, heads,
    dim) tensor, a row apart by 3 * heads * dim."""
    gen = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(total, 3, heads, dim, generator=gen) * 2).bfloat16()
    return qkv.unbind(1)


@pytest.mark.parametrize("dim", [16, 32, 64, 128])
def test_matches_the_reference_on_fused_and_separate_projections(
    kernel: KernelAttention, dim: int
) -> None:
    if dim not in kernel.head_dims:
        pytest.skip(f"{type(kernel).__name__} takes heads of {kernel.head_dims}")
    seqs = packed(LENGTHS)
    q, k, v = _qkv(seqs.total, dim)
    # Rotated q and k are tensors of their own, v still a view: three strides.
    layouts = {"fused": (q, k, v), "separate": (q.contiguous(), k.contiguous(), v)}
    for name, (qs, ks, vs) in layouts.items():
        for scale in (None, 0.3):
            got = kernel(qs, ks, vs, seqs, scale)
            assert got is not None and got.dtype == torch.bfloat16
            want = reference_attention(qs.float(), ks.float(), vs.float(), seqs, scale=scale)
            torch.testing.assert_close(got.float(), want, **_tolerance(kernel), msg=name)
            if isinstance(kernel, WidenedAttention):
                # The float32 reference rounded once, but where the two float32 sums straddle
                # a rounding boundary (about 1 value in 7,000 here).
                assert (got == want.bfloat16()).float().mean() > 0.999, name


@pytest.mark.parametrize("dim", [32, 64])
def test_a_relative_position_bias_keeps_float32_attentions_values(
    kernel: KernelAttention, dim: int
) -> None:
    seqs = packed(LENGTHS)
    q, k, v = _qkv(seqs.total, dim, seed=2)
    bias = relative_bias(HEADS)
    got = kernel(q, k, v, seqs, None, bias)
    assert got is not None
    want = reference_attention(q.float(), k.float(), v.float(), seqs, bias=bias)
    # AMX's P in two bfloat16 parts: what is left is the result's own rounding to bfloat16.
    torch.testing.assert_close(got.float(), want, atol=1e-3, rtol=2**-8)
    # Each sequence reads the top-left corner of the longest one's bias.
    rows = slice(seqs.starts[1], seqs.starts[1] + seqs.lengths[1])
    alone = kernel(q[rows], k[rows], v[rows], packed([seqs.lengths[1]]), None, bias)
    assert alone is not None and torch.equal(alone, got[rows])


def test_a_sequence_gets_the_same_values_in_any_pass(kernel: KernelAttention) -> None:
    seqs = packed(LENGTHS)
    q, k, v = _qkv(seqs.total, 32)
    together = kernel(q, k, v, seqs)
    assert together is not None
    for start, n in zip(seqs.starts, seqs.lengths, strict=True):
        rows = slice(start, start + n)
        alone = kernel(q[rows], k[rows], v[rows], packed([n]))
        assert alone is not None
        assert torch.equal(alone, together[rows]), n


def test_filler_rows_are_zeros_and_change_nothing(kernel: KernelAttention) -> None:
    seqs = packed([40, 7])
    q, k, v = _qkv(seqs.total + 9, 32)
    padded = seqs.with_filler(seqs.total + 9)
    got = kernel(q, k, v, padded)
    want = kernel(q[: seqs.total], k[: seqs.total], v[: seqs.total], seqs)
    assert got is not None and want is not None
    assert torch.equal(got[: seqs.total], want)
    assert not got[seqs.total :].any()


def test_a_layout_too_large_to_keep_is_its_calls_own(amx: AmxAttention) -> None:
    """Past 64 MiB (`KEPT_MAX` in short_kernel.c) a call's layout is allocated and freed by the
    call; below it the thread's is kept. Large, then small, then large again, a text's values
    the same in each as alone."""
    large = packed([200] * 150)  # 30,000 rows of 12 heads of 64: 148 MiB laid out
    lq, lk, lv = _qkv(large.total, 64, seed=3, heads=12)
    small = packed(LENGTHS)
    q, k, v = _qkv(small.total, 32)
    first = amx(lq, lk, lv, large)
    assert first is not None
    for _ in range(2):
        got = amx(q, k, v, small)
        assert got is not None
        assert torch.equal(got[-300:], amx(q[-300:], k[-300:], v[-300:], packed([300])))
    again = amx(lq, lk, lv, large)
    assert again is not None and torch.equal(again, first)
    last = slice(large.total - 200, large.total)
    alone = amx(lq[last], lk[last], lv[last], packed([200]))
    assert alone is not None and torch.equal(alone, first[last])
    want = reference_attention(lq[last].float(), lk[last].float(), lv[last].float(), packed([200]))
    torch.testing.assert_close(alone.float(), want, atol=1e-2, rtol=1.6e-2)


def test_calls_it_does_not_fit_take_the_grouped_path(kernel: KernelAttention) -> None:
    seqs = packed([20, 9])
    q, k, v = _qkv(seqs.total, 32)
    held_out = PackedSequences(seqs.cu_seqlens, 20, key_lengths=[12, 9])
    tiny = packed([3] * 1300)
    tq, tk, tv = _qkv(tiny.total, 32)
    cases = {
        "causal": ((q, k, v, seqs), {"causal": True}),
        "window": ((q, k, v, seqs), {"window": 8}),
        "fewer key heads": ((q, k[:, :1], v[:, :1], seqs), {}),
        "float32": ((q.float(), k.float(), v.float(), seqs), {}),
        "48 dimensions": ((*_qkv(seqs.total, 48), seqs), {}),
        "held-out keys": ((q, k, v, held_out), {}),
    }
    if isinstance(kernel, AmxAttention):
        cases["1,300 texts of 3 tokens"] = ((tq, tk, tv, tiny), {})
    else:
        # Faster than ATen's bfloat16 calls at every length, one-token texts included.
        assert kernel(tq, tk, tv, tiny) is not None
        ones = packed([1] * 2000)
        assert kernel(*_qkv(ones.total, 32), ones) is not None
    for name, (args, options) in cases.items():
        with cpu_kernels(CpuKernels(attention=kernel)):
            got = packed_attention(*args, **options)
        assert torch.equal(got, packed_attention(*args, **options)), name
    assert kernel(q.float(), k.float(), v.float(), seqs) is None
    assert kernel(q, k, v, held_out) is None
    on_kernel = kernel(q, k, v, seqs)
    assert on_kernel is not None
    with cpu_kernels(CpuKernels(attention=kernel)):
        assert torch.equal(packed_attention(q, k, v, seqs), on_kernel)


def _layer_norm(n: int, seed: int = 0) -> nn.LayerNorm:
    gen = torch.Generator().manual_seed(seed)
    norm = nn.LayerNorm(n, eps=1e-12).bfloat16()
    with torch.no_grad():
        norm.weight.copy_(1 + 0.2 * torch.randn(n, generator=gen))
        norm.bias.copy_(0.1 * torch.randn(n, generator=gen))
    return norm


@pytest.mark.parametrize("dim", [16, 32, 64, 128])
def test_an_int8_models_float32_rows_are_rounded_for_the_dot_products(dim: int) -> None:
    """`RoundedAttention` (an int8 model's): its float32 rows rounded to bfloat16 give the dot
    products' kernel's sums on those rounded rows, written in float32; a call with a score bias
    goes to the kernel it was given."""
    if "avx512_bf16" not in cpu_flags():
        pytest.skip("this CPU has no AVX512-BF16")
    lib = load_library(run_cache())
    assert lib is not None
    with_bias = FloatAttention(lib)
    rounded, dot = RoundedAttention(lib, with_bias), DotAttention(lib)
    seqs = packed(LENGTHS)
    gen = torch.Generator().manual_seed(5)
    # float32 rows between bfloat16's values, in a fused projection's layout.
    q, k, v = (torch.randn(seqs.total, 3, HEADS, dim, generator=gen) * 2).unbind(1)
    got = rounded(q, k, v, seqs)
    assert got is not None and got.dtype == torch.float32
    want = dot(q.bfloat16(), k.bfloat16(), v.bfloat16(), seqs)
    assert want is not None
    assert torch.equal(got.bfloat16(), want)
    assert not torch.equal(got, got.bfloat16().float()), "the output was rounded"
    # With a bias: the float32 kernel's call on the float32 rows.
    bias = relative_bias(HEADS)
    kept = rounded(q, k, v, seqs, None, bias)
    assert kept is not None
    assert torch.equal(kept, with_bias(q, k, v, seqs, None, bias))


@pytest.mark.parametrize("n", [384, 100])
def test_the_residual_step_gives_torchs_values(kernels: CpuKernels, n: int) -> None:
    assert isinstance(kernels.add_norm, AddNorm)
    gen = torch.Generator().manual_seed(1)
    a = (3 * torch.randn(300, n, generator=gen)).bfloat16()
    b = (3 * torch.randn(300, n, generator=gen)).bfloat16()
    norm = _layer_norm(n)
    with torch.inference_mode():
        got = kernels.add_norm(a.clone(), b, norm)
        want = norm(a.clone().add_(b))
    assert got is not None and got.dtype == torch.bfloat16
    # LayerNorm's sums in another order: now and then one bfloat16 step apart, never more.
    step = want.float().abs().clamp(min=2**-30) * 2**-7
    apart = (got.float() - want.float()).abs()
    assert (apart <= step).all()
    assert (apart > 0).float().mean() < 1e-3


def test_residual_steps_it_does_not_fit_take_torchs(kernels: CpuKernels) -> None:
    a = torch.randn(8, 64).bfloat16()
    b = torch.randn(8, 64).bfloat16()
    norm = _layer_norm(64)
    no_bias = nn.LayerNorm(64, bias=False).bfloat16()
    cases = {
        "float32": (a.float(), b.float(), norm.float()),
        "no bias": (a, b, no_bias),
        "not a LayerNorm": (a, b, nn.Identity()),
        "strided": (a.t().contiguous().t(), b, norm),
    }
    assert kernels.add_norm is not None
    with torch.inference_mode():
        for name, (x, y, layer) in cases.items():
            assert kernels.add_norm(x.clone(), y, layer) is None, name
            with cpu_kernels(kernels):
                got = add_norm(x.clone(), y, layer)
            assert torch.equal(got, layer(x.clone().add_(y))), name


def test_a_bfloat16_backend_takes_them_and_keeps_its_vectors(minilm: Path) -> None:
    spec = load_model_spec(minilm, ModelSettings(str(minilm)))
    backend = TorchBackend(spec, "cpu", "bfloat16")
    kernels = backend.passes.kernels
    assert isinstance(kernels.add_norm, AddNorm)
    flags = cpu_flags()
    chosen = (
        AmxAttention
        if "amx_bf16" in flags
        else DotAttention
        if "avx512_bf16" in flags
        else WidenedAttention
    )
    assert isinstance(kernels.attention, chosen)
    # Longer than the short passes, which run on the short-pass kernel or natively.
    batches = tokenized_batches(minilm, corpus(200, seed=1)[::4], 16)
    on_kernels = pooled(backend, batches)
    backend.passes.kernels = NONE
    native = pooled(backend, batches)
    assert not np.array_equal(on_kernels, native), "the kernels never ran"
    assert_close_vectors(on_kernels, native, min_cos=0.9999, what="kernels vs torch's ops")
