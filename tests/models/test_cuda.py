"""The CUDA path (FlashAttention through varlen_attn, float16 / bfloat16) against the CPU reference.

Skipped, not failed, where no CUDA device is present; the start-up choice itself is checked
everywhere.
"""

from __future__ import annotations

import asyncio
import dataclasses
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
from vectorpress.model_spec import ModelSpec, load_model_spec
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


def _batches(folder: Path, spec: ModelSpec, texts: list[list[str]]) -> list[Batch]:
    """One batch of each list of texts, tokenized as the server does."""
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
        return [Batch.from_encodings(asyncio.run(pool.encode(t, truncate=True))) for t in texts]
    finally:
        pool.close()


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
    (batch,) = _batches(folder, spec, [[*mixed_texts(12, seed=9, long_share=0.3), "a"]])
    cpu = TorchBackend(spec, "cpu", "float32").embed(batch).pooled
    gpu_backend = TorchBackend(spec, "cuda", dtype)
    assert gpu_backend.varlen, "the CUDA backend did not pick varlen_attn"
    gpu = gpu_backend.embed(batch).pooled
    assert cpu is not None and gpu is not None
    assert_close_vectors(gpu, cpu, min_cos=0.999, what=f"{arch} cuda {dtype} vs cpu float32")


@needs_cuda
@pytest.mark.parametrize(
    ("arch", "dtype", "pooling"),
    [
        ("bert", "float16", "mean"),
        ("bert", "float16", "cls"),
        ("modernbert", "bfloat16", "mean"),
        ("qwen3", "float16", "last_token"),
    ],
)
def test_cuda_graphs_equal_the_eager_pass(
    tiny: Callable[..., Path], arch: str, dtype: str, pooling: str
) -> None:
    """Batches of many shapes from graphs (several buckets, a bucket replayed with other
    batches, graphs evicted and captured again) give the eager pass's vectors, pooled in the
    graph; per-token outputs come from the graph's hidden states."""
    folder = tiny(arch, "embedding", pooling)
    spec = load_model_spec(folder, ModelSettings(str(folder)))
    sizes = [1, 3, 1, 17, 40, 3, 120, 17, 1]
    batches = _batches(
        folder, spec, [mixed_texts(n, seed=20 + i, long_share=0.2) for i, n in enumerate(sizes)]
    )
    eager = TorchBackend(spec, "cuda", dtype, cuda_graphs=False)
    assert eager.graphs is None
    graphed = TorchBackend(spec, "cuda", dtype)
    assert graphed.graphs is not None
    graphed.graphs.max_graphs = 3
    for i, batch in enumerate(batches):
        want = eager.embed(batch).pooled
        got = graphed.embed(batch).pooled
        assert got is not None and want is not None
        assert graphed.graphs.off is None, graphed.graphs.off
        assert_close_vectors(got, want, min_cos=0.9999, what=f"{arch} {dtype} batch {i}")
    assert 1 <= len(graphed.graphs.graphs) <= 3
    # Past the memory budget only the newest graph stays.
    graphed.graphs.max_bytes = 1
    for batch in batches[4:7]:
        want, got = eager.embed(batch).pooled, graphed.embed(batch).pooled
        assert got is not None and want is not None
        assert_close_vectors(got, want, min_cos=0.9999, what=f"{arch} {dtype} one graph kept")
        assert len(graphed.graphs.graphs) == 1
    raw = dataclasses.replace(batches[3], pooled_indices=(0, 2), raw_indices=(1, 3))
    want_raw, got_raw = eager.embed(raw), graphed.embed(raw)
    assert want_raw.pooled is not None and got_raw.pooled is not None
    assert_close_vectors(got_raw.pooled, want_raw.pooled, min_cos=0.9999, what="pooled beside raw")
    for got_rows, want_rows in zip(got_raw.raw, want_raw.raw, strict=True):
        assert_close_vectors(got_rows, want_rows, min_cos=0.9999, what=f"{arch} raw rows")


@needs_cuda
def test_a_model_that_groups_on_the_host_runs_eagerly(
    tiny: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    """MPNet's relative-position bias keeps its attention on the SDPA path, whose length groups
    live on the host: its first capture fails, and it goes on eagerly, still right."""
    folder = tiny("mpnet", "embedding", "mean")
    spec = load_model_spec(folder, ModelSettings(str(folder)))
    (batch,) = _batches(folder, spec, [mixed_texts(9, seed=5)])
    cpu = TorchBackend(spec, "cpu", "float32").embed(batch).pooled
    gpu = TorchBackend(spec, "cuda", "float16")
    with caplog.at_level("WARNING", logger="vectorpress.backends.torch.cuda_graphs"):
        first = gpu.embed(batch).pooled
    assert gpu.graphs is not None and gpu.graphs.off is not None
    assert any("CUDA graphs off" in r.getMessage() for r in caplog.records)
    second = gpu.embed(batch).pooled
    assert cpu is not None and first is not None and second is not None
    assert_close_vectors(first, cpu, min_cos=0.999, what="mpnet cuda float16, first batch")
    assert_close_vectors(second, cpu, min_cos=0.999, what="mpnet cuda float16, after")
