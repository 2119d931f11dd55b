"""The CUDA path (FlashAttention through varlen_attn, float16 / bfloat16) against the CPU reference.

Skipped, not failed, where no CUDA device is present; the start-up choice itself is checked
everywhere.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.attention import reference_attention
from tests.helpers.reference import assert_close_vectors
from tests.helpers.texts import mixed_texts
from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.torch.attention import varlen_attention, varlen_usable
from vectorpress.backends.torch.backend import TorchBackend
from vectorpress.core.tokenization import TokenizerPool
from vectorpress.model_spec import load_model_spec
from vectorpress.settings import ModelSettings
from vectorpress.types import Batch

needs_cuda = pytest.mark.skipif(
    not (torch.cuda.is_available() and varlen_usable("cuda", torch.float16)[0]),
    reason="needs a CUDA device and torch.nn.attention.varlen",
)
HALF = {"float16": torch.float16, "bfloat16": torch.bfloat16}
# Half precision keeps ~3 (bf16: ~2) significant digits per product; these bound the error of
# attention outputs of unit-scale inputs against the float32 reference.
ATOL = {"float16": 3e-3, "bfloat16": 2e-2}


def test_start_up_choice_is_logged_and_cpu_keeps_sdpa(
    tiny: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    assert varlen_usable("cpu", torch.float32) == (False, "not on CUDA")
    assert not varlen_usable("cuda", torch.float32)[0]
    folder = tiny("modernbert")
    with caplog.at_level("INFO", logger="vectorpress.backends.torch.backend"):
        backend = TorchBackend(load_model_spec(folder, ModelSettings(str(folder))), "cpu")
    assert backend.varlen is False
    assert any("attention: sdpa (not on CUDA)" in r.getMessage() for r in caplog.records)


@needs_cuda
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(
    ("causal", "window", "kv_heads"),
    [(False, None, 4), (True, None, 4), (False, 16, 4), (True, 30, 2), (False, None, 1)],
)
def test_varlen_equals_reference(
    dtype: str, causal: bool, window: int | None, kv_heads: int
) -> None:
    gen = torch.Generator().manual_seed(0)
    lengths = [1, 7, 64, 130, 64, 3, 257]
    total = sum(lengths)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    q = torch.randn(total, 4, 32, generator=gen)
    k = torch.randn(total, kv_heads, 32, generator=gen)
    v = torch.randn(total, kv_heads, 32, generator=gen)
    half = [t.to("cuda", HALF[dtype]) for t in (q, k, v)]
    seqs = PackedSequences(cu.cuda(), max(lengths), varlen=True)
    got = varlen_attention(*half, seqs, causal=causal, window=window).float().cpu()
    ref_seqs = PackedSequences(cu, max(lengths))
    want = reference_attention(
        *(t.float().cpu() for t in half), ref_seqs, causal=causal, window=window
    )
    err = (got - want).abs().max().item()
    assert err <= ATOL[dtype], f"{dtype} causal={causal} window={window}: max abs err {err:.2e}"


@needs_cuda
@pytest.mark.parametrize(
    ("arch", "dtype"),
    [
        ("bert", "float16"),
        ("modernbert", "float16"),
        ("modernbert", "bfloat16"),
        ("qwen3", "float16"),
        ("mistral", "bfloat16"),
        ("gemma3_text", "bfloat16"),
    ],
)
def test_cuda_half_model_equals_cpu_float32(
    tiny: Callable[..., Path], arch: str, dtype: str
) -> None:
    pooling = "last_token" if arch in ("qwen3", "mistral") else "mean"
    folder = tiny(arch, "embedding", pooling)
    spec = load_model_spec(folder, ModelSettings(str(folder)))
    pool = TokenizerPool.from_folder(
        folder,
        max_input_length=spec.max_input_length,
        position_offset=spec.position_offset,
        vocab_size=spec.vocab_size,
        prompts={},
        default_prompt=None,
        workers=1,
    )
    try:
        texts = [*mixed_texts(12, seed=9, long_share=0.3), "a"]
        batch = Batch.from_encodings(asyncio.run(pool.encode(texts, truncate=True)))
    finally:
        pool.close()
    cpu = TorchBackend(spec, "cpu", "float32").embed(batch).pooled
    gpu_backend = TorchBackend(spec, "cuda", dtype)
    assert gpu_backend.varlen, "the CUDA backend did not pick varlen_attn"
    gpu = gpu_backend.embed(batch).pooled
    assert cpu is not None and gpu is not None
    assert_close_vectors(gpu, cpu, min_cos=0.999, what=f"{arch} cuda {dtype} vs cpu float32")
