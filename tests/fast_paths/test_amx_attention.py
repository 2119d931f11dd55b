"""bfloat16 attention on AMX's tiles (backends/torch/amx_attention.py): one explicit softmax per
sequence (the reference) on every layout the layers hand it, a sequence's values independent of
its pass, filler rows, the calls it leaves to the grouped path, and a bfloat16 backend that
takes it without losing its accuracy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from bench.corpus import corpus

from tests.helpers.attention import reference_attention
from tests.helpers.batches import pooled, tokenized_batches
from tests.helpers.cpu import needs_amx, needs_kernel
from tests.helpers.reference import assert_close_vectors
from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.torch.amx_attention import AmxAttention, amx_attention
from vectorpress.backends.torch.attention import kernel_attention, packed_attention
from vectorpress.backends.torch.backend import TorchBackend
from vectorpress.model_spec import load_model_spec
from vectorpress.settings import ModelSettings

pytestmark = [needs_kernel, needs_amx]

# Around the kernel's blocks: 16 queries, 32 keys.
LENGTHS = [1, 5, 15, 16, 17, 31, 32, 33, 64, 100, 300]
HEADS = 3


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> AmxAttention:
    built = amx_attention(torch.bfloat16, tmp_path_factory.mktemp("kernels"))
    assert built is not None
    return built


def _seqs(lengths: list[int]) -> PackedSequences:
    cu = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int64)
    return PackedSequences(cu, max(lengths))


def _qkv(total: int, dim: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """q, k and v as a fused projection's output leaves them: views of one (total, 3, heads,
    dim) tensor, a row apart by 3 * heads * dim."""
    gen = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(total, 3, HEADS, dim, generator=gen) * 2).bfloat16()
    return qkv.unbind(1)


@pytest.mark.parametrize("dim", [32, 64])
def test_matches_the_reference_on_fused_and_separate_projections(
    kernel: AmxAttention, dim: int
) -> None:
    seqs = _seqs(LENGTHS)
    q, k, v = _qkv(seqs.total, dim)
    # Rotated q and k are tensors of their own, v still a view: three strides.
    layouts = {"fused": (q, k, v), "separate": (q.contiguous(), k.contiguous(), v)}
    for name, (qs, ks, vs) in layouts.items():
        for scale in (None, 0.3):
            got = kernel(qs, ks, vs, seqs, scale)
            assert got is not None and got.dtype == torch.bfloat16
            want = reference_attention(qs.float(), ks.float(), vs.float(), seqs, scale=scale)
            # bfloat16's own step: its output rounding and P's, as ATen's flash kernel rounds.
            torch.testing.assert_close(got.float(), want, atol=1e-2, rtol=1.6e-2, msg=name)


def test_a_sequence_gets_the_same_values_in_any_pass(kernel: AmxAttention) -> None:
    seqs = _seqs(LENGTHS)
    q, k, v = _qkv(seqs.total, 32)
    together = kernel(q, k, v, seqs)
    assert together is not None
    for start, n in zip(seqs.starts, seqs.lengths, strict=True):
        rows = slice(start, start + n)
        alone = kernel(q[rows], k[rows], v[rows], _seqs([n]))
        assert alone is not None
        assert torch.equal(alone, together[rows]), n


def test_filler_rows_are_zeros_and_change_nothing(kernel: AmxAttention) -> None:
    seqs = _seqs([40, 7])
    q, k, v = _qkv(seqs.total + 9, 32)
    padded = seqs.with_filler(seqs.total + 9)
    got = kernel(q, k, v, padded)
    want = kernel(q[: seqs.total], k[: seqs.total], v[: seqs.total], seqs)
    assert got is not None and want is not None
    assert torch.equal(got[: seqs.total], want)
    assert not got[seqs.total :].any()


def test_calls_it_does_not_fit_take_the_grouped_path(kernel: AmxAttention) -> None:
    seqs = _seqs([20, 9])
    q, k, v = _qkv(seqs.total, 32)
    held_out = PackedSequences(seqs.cu_seqlens, 20, key_lengths=[12, 9])
    cases = {
        "causal": ((q, k, v, seqs), {"causal": True}),
        "window": ((q, k, v, seqs), {"window": 8}),
        "bias": ((q, k, v, seqs), {"bias": lambda n, dtype: torch.zeros(HEADS, n, n, dtype=dtype)}),
        "fewer key heads": ((q, k[:, :1], v[:, :1], seqs), {}),
        "float32": ((q.float(), k.float(), v.float(), seqs), {}),
        "48 dimensions": ((*_qkv(seqs.total, 48), seqs), {}),
        "held-out keys": ((q, k, v, held_out), {}),
    }
    for name, (args, options) in cases.items():
        with kernel_attention(kernel):
            got = packed_attention(*args, **options)
        assert torch.equal(got, packed_attention(*args, **options)), name
    assert kernel(q.float(), k.float(), v.float(), seqs) is None
    assert kernel(q, k, v, held_out) is None
    on_kernel = kernel(q, k, v, seqs)
    assert on_kernel is not None
    with kernel_attention(kernel):
        assert torch.equal(packed_attention(q, k, v, seqs), on_kernel)


def test_a_bfloat16_backend_takes_it_and_keeps_its_vectors(minilm: Path) -> None:
    spec = load_model_spec(minilm, ModelSettings(str(minilm)))
    assert TorchBackend(spec, "cpu", "float32").passes.attention is None
    backend = TorchBackend(spec, "cpu", "bfloat16")
    assert isinstance(backend.passes.attention, AmxAttention)
    # Longer than the short passes, which run on the short-pass kernel or natively.
    batches = tokenized_batches(minilm, corpus(200, seed=1)[::4], 16)
    on_kernel = pooled(backend, batches)
    backend.passes.attention = None
    native = pooled(backend, batches)
    assert not np.array_equal(on_kernel, native), "the kernel never ran"
    assert_close_vectors(on_kernel, native, min_cos=0.9999, what="kernel vs grouped attention")
