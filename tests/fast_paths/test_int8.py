"""--dtype int8: within cosine 0.99 of float32 on every benchmark corpus text, a text's vector
independent of its batch-mates, over HTTP, and refused where it cannot run (every native
architecture: tests/models/test_fused.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from bench.corpus import corpus

from tests.helpers.batches import alone_and_together, assert_quantized_close, pooled
from tests.helpers.cpu import needs_bf16_int8, needs_fbgemm
from tests.helpers.reference import assert_close_vectors, st_encode
from tests.helpers.server import LiveServer
from vectorpress.backends.common.calibration import ALPHA, smoothing
from vectorpress.backends.select import select_backend
from vectorpress.backends.torch import backend as backend_module
from vectorpress.backends.torch.backend import TorchBackend
from vectorpress.backends.torch.int8 import Int8Weights, OnednnInt8
from vectorpress.backends.torch.layers import fused_linears
from vectorpress.errors import StartupError
from vectorpress.model_spec import load_model_spec
from vectorpress.settings import ModelSettings, Settings
from vectorpress.types import Batch


@pytest.fixture(scope="module")
def int8_minilm(minilm: Path) -> TorchBackend:
    return TorchBackend(load_model_spec(minilm, ModelSettings(str(minilm))), "cpu", "int8")


@pytest.fixture(scope="module")
def fbgemm_minilm(minilm: Path) -> Iterator[TorchBackend]:
    """int8 on fbgemm with float32 around it, as CPUs without VNNI and bfloat16 run it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(backend_module, "bf16_int8_supported", lambda: False)
        yield TorchBackend(load_model_spec(minilm, ModelSettings(str(minilm))), "cpu", "int8")


@needs_fbgemm
@pytest.mark.slow
def test_int8_within_099_of_float32_on_every_corpus_text(
    int8_minilm: TorchBackend, corpus_batches: list[Batch], corpus_fp32: np.ndarray
) -> None:
    want = corpus_fp32
    got = pooled(int8_minilm, corpus_batches)
    linears = fused_linears(int8_minilm.model.encoder)
    assert len(linears) == 24 and all(lin.int8 is not None for lin in linears)
    assert_quantized_close(got, want, "int8 vs fp32")


@needs_bf16_int8
def test_int8_around_bfloat16_matches_the_float32_int8_layer() -> None:
    # The same weights, smoothing and row ranges on both kernels: only bfloat16's rounding of
    # the input and output differs.
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 64, generator=gen)
    bias = torch.randn(96, generator=gen)
    x = torch.randn(37, 64, generator=gen) * torch.rand(37, 1, generator=gen) * 4
    smooth = smoothing(weight, x.abs().amax(0), ALPHA)
    for low in (1.0, 0.3):
        fbgemm = Int8Weights.of(weight, smooth, low)
        want = fbgemm(x.clamp_min(-low * x.abs().amax()), bias)
        got = OnednnInt8(fbgemm)(
            x.clamp_min(-low * x.abs().amax()).bfloat16(), bias.bfloat16()
        ).float()
        assert got.dtype == torch.float32 and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * float(want.abs().max()))


@needs_bf16_int8
def test_int8_on_fbgemm_in_float32_stays_close(
    minilm: Path,
    int8_minilm: TorchBackend,
    fbgemm_minilm: TorchBackend,
    corpus_batches: list[Batch],
    corpus_fp32: np.ndarray,
) -> None:
    """The float32 path CPUs without VNNI or bfloat16 take, on this one; both within 0.99 of
    float32 on a slice of the corpus and close to each other."""
    assert int8_minilm.int8_bf16 and not fbgemm_minilm.int8_bf16
    fbgemm = pooled(fbgemm_minilm, corpus_batches[:3])
    onednn = pooled(int8_minilm, corpus_batches[:3])
    assert_quantized_close(fbgemm, corpus_fp32[: len(fbgemm)], "fbgemm int8 vs fp32")
    assert_close_vectors(onednn, fbgemm, min_cos=0.99, what="int8 around bf16 vs fbgemm")


@needs_fbgemm
@pytest.mark.parametrize("kernel", ["default", "fbgemm"])
def test_an_int8_vector_does_not_depend_on_its_batch_mates(
    minilm: Path, kernel: str, request: pytest.FixtureRequest
) -> None:
    name = "int8_minilm" if kernel == "default" else "fbgemm_minilm"
    backend: TorchBackend = request.getfixturevalue(name)
    alone, together = alone_and_together(backend, minilm, corpus(48, seed=3))
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
