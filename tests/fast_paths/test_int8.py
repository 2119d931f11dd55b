"""--dtype int8: within cosine 0.99 of float32 on every benchmark corpus text, a text's vector
independent of its batch-mates, over HTTP, and refused where it cannot run (every native
architecture: tests/models/test_fused.py)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from bench.corpus import corpus

from tests.helpers.batches import (
    alone_and_together,
    assert_quantized_close,
    pooled,
    tokenized_batches,
)
from tests.helpers.checkpoints import make_tiny
from tests.helpers.cpu import needs_fbgemm, needs_kernel
from tests.helpers.kernels import run_cache
from tests.helpers.pages import huge_kib, thp_given
from tests.helpers.reference import assert_close_vectors, st_encode
from tests.helpers.server import LiveServer
from vectorpress.backends.select import select_backend
from vectorpress.backends.torch import backend as backend_module
from vectorpress.backends.torch.backend import TorchBackend
from vectorpress.backends.torch.bf16_kernels import RoundedAttention
from vectorpress.backends.torch.f32_kernels import FloatAttention
from vectorpress.backends.torch.int8 import (
    CompiledFinish,
    CompiledQuantizeRows,
    CompiledScaleRows,
    Int8Weights,
    finish,
    int8_missing,
    onednn_int8_missing,
    quantize_rows,
    scale_rows,
)
from vectorpress.backends.torch.int8_kernel import Int8Kernel
from vectorpress.backends.torch.layers import fused_linears
from vectorpress.backends.torch.passes import KERNEL, CpuPasses, PassPlan
from vectorpress.backends.torch.short_kernel import load_library
from vectorpress.cpus import cpu_flags
from vectorpress.errors import StartupError
from vectorpress.model_spec import load_model_spec
from vectorpress.settings import ModelSettings, Settings
from vectorpress.types import Batch


@pytest.fixture(scope="module", params=["oneDNN", "kernel", "fbgemm"])
def int8_minilm(request: pytest.FixtureRequest, minilm: Path) -> TorchBackend:
    """all-MiniLM-L6-v2 in int8 on each GEMM: start-up as if its timing had found that one
    faster on larger passes and the other on short ones (every pass must still take one);
    "kernel": oneDNN's kept, every pass on the int8 kernel (`int8_kernel.py`)."""
    gemm: str = request.param
    onednn = gemm != "fbgemm"
    missing = int8_missing() or (onednn_int8_missing() if onednn else None)
    if gemm == "kernel" and missing is None and "avx512_vnni" not in cpu_flags():
        missing = "this CPU has no AVX512-VNNI"
    if missing is not None:
        pytest.skip(missing)
    timed = backend_module.plan_passes

    def timed_as(*args: Any, **kwargs: Any) -> PassPlan:
        plan = timed(*args, **kwargs)
        on_kernel = gemm == "kernel"
        return dataclasses.replace(
            plan,
            small_onednn=not onednn,
            large_onednn=onednn,
            small_shortcut=KERNEL if on_kernel else "",
            large_shortcut=on_kernel,
        )

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(backend_module, "plan_passes", timed_as)
        backend = TorchBackend(load_model_spec(minilm, ModelSettings(str(minilm))), "cpu", "int8")
    assert backend.passes.plan.small_onednn == backend.passes.plan.large_onednn == onednn
    assert (backend.passes.shortcut is not None) == (gemm == "kernel")
    assert backend.passes.plan.large_shortcut == (gemm == "kernel")
    assert all(
        lin.int8 is not None and lin.int8.kernels == ("oneDNN" if onednn else "fbgemm",)
        for lin in fused_linears(backend.model.encoder)
    )
    return backend


@needs_fbgemm
@pytest.mark.slow
def test_int8_within_099_of_float32_on_every_corpus_text(
    int8_minilm: TorchBackend,
    minilm: Path,
    corpus_batches: list[Batch],
    corpus_fp32: np.ndarray,
) -> None:
    want = corpus_fp32
    got = pooled(int8_minilm, corpus_batches)
    linears = fused_linears(int8_minilm.model.encoder)
    assert len(linears) == 24 and all(lin.int8 is not None for lin in linears)
    assert_quantized_close(got, want, "int8 vs fp32")


@needs_fbgemm
@needs_kernel
def test_int8_attention_runs_on_the_dot_products_where_the_cpu_has_them(
    int8_minilm: TorchBackend,
) -> None:
    attention = int8_minilm.passes.kernels.attention
    dot = "avx512_bf16" in cpu_flags()
    assert isinstance(attention, RoundedAttention if dot else FloatAttention)
    if dot:
        assert isinstance(attention, RoundedAttention)
        assert isinstance(attention.with_bias, FloatAttention)


@needs_fbgemm
def test_an_int8_vector_does_not_depend_on_its_batch_mates(
    minilm: Path, int8_minilm: TorchBackend
) -> None:
    alone, together = alone_and_together(int8_minilm, minilm, corpus(48, seed=3))
    # Exactly: each row is quantized on its own scale and the int8 GEMM sums exactly.
    np.testing.assert_array_equal(alone, together)


@needs_fbgemm
def test_int8_over_http_is_close_to_sentence_transformers(minilm: Path) -> None:
    texts = ["what is the capital of Australia", *corpus(6, seed=9)]
    want = st_encode(minilm, texts)
    with LiveServer(Settings.single(str(minilm), dtype="int8")) as server:
        info = httpx.get(f"{server.url}/info").json()
        got = httpx.post(f"{server.url}/embed", json={"inputs": texts}, timeout=30).json()
    assert info["model_dtype"] == "int8"
    assert_close_vectors(got, want, min_cos=0.99, what="int8 server vs sentence-transformers")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"device": "cuda"}, "CPU only"),
        ({"backend": "hf"}, "torch and onnx backends only"),
        ({"backend": "onnx", "device": "cuda"}, "CPU only"),
    ],
)
def test_int8_is_refused_where_it_cannot_run(
    tiny_bert_family: Callable[..., Path], options: dict[str, str], message: str
) -> None:
    folder = tiny_bert_family()
    settings = Settings.single(str(folder), dtype="int8", **options)  # type: ignore[arg-type]
    spec = load_model_spec(folder, settings.model)
    with pytest.raises(StartupError, match=message):
        select_backend(spec, settings.model)


def _hard_rows(rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows for the compiled row kernels, with the cases they must get right, and an unsmoothing
    factor."""
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(rows, width, generator=gen) * 3
    x[5, 7] = 400.0  # an outlier row
    x[9] = 0.0  # a row of zeros: the scale's floor
    x[11] = x[11].abs()  # a one-sided row
    x[12] = -x[12].abs() * 5  # a row far below its range: scaled, not clipped
    return x, torch.rand(width, generator=gen) + 0.5


@needs_kernel
@pytest.mark.parametrize("width", [384, 1536, 100])
@pytest.mark.parametrize("low", [1.0, 0.3])
def test_the_compiled_row_scaling_gives_torchs_values(width: int, low: float) -> None:
    lib = load_library(run_cache())
    assert lib is not None
    compiled = CompiledScaleRows(lib)
    x, unsmooth = _hard_rows(333, width)
    want_body, got_body = torch.empty_like(x), torch.full_like(x, float("nan"))
    want = scale_rows(x, unsmooth, low, want_body)
    got = compiled(x, unsmooth, low, got_body)
    assert torch.equal(got, want) and torch.equal(got_body, want_body)
    # A strided input takes torch's ops.
    strided = x.t().contiguous().t()
    assert torch.equal(compiled(strided, unsmooth, low, got_body), want)


@needs_kernel
@pytest.mark.parametrize("width", [384, 1536, 100])
@pytest.mark.parametrize("low", [1.0, 0.3])
def test_the_compiled_row_quantization_gives_torchs_values(width: int, low: float) -> None:
    lib = load_library(run_cache())
    assert lib is not None
    compiled = CompiledQuantizeRows(lib)
    # Enough values that a rounding apart from fbgemm's (the zero point added after rounding,
    # or outside one fused multiply-add: a few values in a million) shows.
    x, unsmooth = _hard_rows(3000, width)
    step = 255 / (1 + low)
    zero = round(low * step)
    want_q = torch.empty(3000, width, dtype=torch.uint8)
    got_q = torch.full_like(want_q, 7)
    want = quantize_rows(x, unsmooth, low, step, zero, want_q)
    got = compiled(x, unsmooth, low, step, zero, got_q)
    assert torch.equal(got, want) and torch.equal(got_q, want_q)
    assert int(want_q.min()) == 0 and int(want_q.max()) == 255  # the whole range is used
    # A strided input takes torch's ops.
    strided = x.t().contiguous().t()
    assert torch.equal(compiled(strided, unsmooth, low, step, zero, got_q), want)


@needs_fbgemm
@pytest.mark.skipif(onednn_int8_missing() is not None, reason=str(onednn_int8_missing()))
@pytest.mark.parametrize("slower", ["oneDNN", "fbgemm"])
def test_start_up_keeps_the_int8_gemm_that_ran_its_pass_faster(
    tiny_bert_family: Callable[..., Path], slower: str
) -> None:
    folder = tiny_bert_family()
    real = Int8Weights.__call__

    def delayed(
        self: Int8Weights, x: torch.Tensor, *args: Any, onednn: bool = True, **kwargs: Any
    ) -> Any:
        on_onednn = self.onednn_packed is not None and (onednn or self.packed is None)
        if ("oneDNN" if on_onednn else "fbgemm") == slower:
            time.sleep(0.005)  # far above a loaded machine's noise on a tiny model's pass
        return real(self, x, *args, onednn=onednn, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Int8Weights, "__call__", delayed)
        backend = TorchBackend(load_model_spec(folder, ModelSettings(str(folder))), "cpu", "int8")
    kept = "fbgemm" if slower == "oneDNN" else "oneDNN"
    linears = fused_linears(backend.model.encoder)
    assert linears and all(lin.int8 is not None and lin.int8.kernels == (kept,) for lin in linears)
    plan = backend.passes.plan
    assert plan.small_onednn == plan.large_onednn == (kept == "oneDNN")


def _on_the_kernel(folder: Path, larger: bool = False) -> TorchBackend:
    """An int8 backend whose start-up timing kept oneDNN's GEMM and the int8 kernel for short
    passes, and for the larger ones where `larger`."""
    timed = backend_module.plan_passes

    def timed_as(*args: Any, **kwargs: Any) -> PassPlan:
        plan = timed(*args, **kwargs)
        return dataclasses.replace(
            plan, large_onednn=True, small_shortcut=KERNEL, large_shortcut=larger
        )

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(backend_module, "plan_passes", timed_as)
        return TorchBackend(load_model_spec(folder, ModelSettings(str(folder))), "cpu", "int8")


needs_vnni = pytest.mark.skipif(
    "avx512_vnni" not in cpu_flags(), reason="this CPU has no AVX512-VNNI"
)


@needs_fbgemm
@needs_kernel
@needs_vnni
@pytest.mark.parametrize("arch", ["distilbert", "mpnet"])
@pytest.mark.parametrize("larger", [False, True], ids=["short", "every"])
def test_int8_passes_on_the_kernel_give_the_modules_values(
    tmp_path: Path, arch: str, larger: bool
) -> None:
    # Heads of 16, the smallest the attention kernels take; MPNet's score bias takes attention
    # in float32 (with_bias), DistilBERT's none. "short": short passes on the kernel, the
    # longer ones on the modules; "every": every pass on the kernel, and the batched passes
    # again on the modules (oneDNN's GEMM, its rows padded), the same to the bit.
    folder = make_tiny(tmp_path / arch, arch, hidden_size=64, intermediate_size=128)
    backend = _on_the_kernel(folder, larger)
    kernel = backend.passes.shortcut
    assert isinstance(kernel, Int8Kernel)
    assert backend.passes.plan.large_shortcut == larger
    # The weights every pass reads are on huge pages where Linux gives them.
    weights = [getattr(layer, name).w for layer in kernel.table for name in ("qkv", "ffn_out")]
    assert all(w % 64 == 0 for w in weights)
    if thp_given():
        assert all(huge_kib(w) > 0 for w in weights)
    offset = backend.spec.position_offset
    texts = corpus(40, seed=4)
    alone = pooled(backend, tokenized_batches(folder, texts, 1, position_offset=offset))
    batches = tokenized_batches(folder, texts, None, position_offset=offset)
    together = pooled(backend, batches)
    np.testing.assert_array_equal(alone, together)
    if larger:
        passes = backend.passes
        plan = dataclasses.replace(passes.plan, large_shortcut=False)
        backend.passes = CpuPasses(
            passes.max_tokens, plan, shortcut=passes.shortcut, kernels=passes.kernels
        )
        np.testing.assert_array_equal(together, pooled(backend, batches))


@needs_fbgemm
@needs_kernel
@needs_vnni
def test_start_up_drops_an_int8_kernel_whose_values_differ(
    tiny_bert_family: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    folder = make_tiny(tiny_bert_family().parent / "wide-distilbert", "distilbert", hidden_size=64)
    real = Int8Kernel.__call__

    def off_by_a_bit(self: Int8Kernel, *args: Any) -> torch.Tensor:
        out = real(self, *args)
        return torch.nextafter(out, torch.full_like(out, float("inf")))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Int8Kernel, "__call__", off_by_a_bit)
        backend = _on_the_kernel(folder, larger=True)
    assert backend.passes.shortcut is None and not backend.passes.plan.large_shortcut
    assert "the passes stay on oneDNN's GEMM" in caplog.text


@needs_kernel
@pytest.mark.parametrize("width", [384, 1536, 100])
@pytest.mark.parametrize("gelu", [False, True])
def test_the_compiled_finish_agrees_with_torchs_ops(width: int, gelu: bool) -> None:
    lib = load_library(run_cache())
    assert lib is not None
    gen = torch.Generator().manual_seed(width)
    y = torch.randn(333, width, generator=gen) * 50
    scale = torch.rand(333, 1, generator=gen) * 0.1
    bias = torch.randn(width, generator=gen)
    for b in (bias, None):
        want = finish(y.clone(), scale, b, gelu)
        got = CompiledFinish(lib)(y.clone(), scale, b, gelu)
        # The fused multiply-add against addcmul's two roundings, the erf against torch's: a few
        # float32 steps apart.
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 if gelu else 1e-6)
