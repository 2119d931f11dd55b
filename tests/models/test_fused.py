"""Every native model beyond BERT runs all its linear layers on FusedLinear, on oneDNN where this
CPU has it, and gives the vectors of the F.linear reference (`fuse(False)`) and of the plain
nn.Linear modules the state dict loads into (no fused path at all); with --dtype int8 every one of
them is quantized and stays within cosine 0.99 of float32."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from tests.helpers.batches import pooled, tokenized_batches
from tests.helpers.reference import assert_close_vectors
from tests.helpers.texts import mixed_texts
from tests.models.test_zoo import DECODERS
from vectorpress.backends.torch.backend import TorchBackend
from vectorpress.backends.torch.layers import fused_linears, onednn_supported
from vectorpress.model_spec import load_model_spec
from vectorpress.settings import ModelSettings

ARCHS = ("distilbert", "mpnet", "modernbert", "qwen2", "qwen3", "mistral", "llama", "gemma3_text")


def _embed(backend: TorchBackend, folder: Path, texts: list[str]) -> np.ndarray:
    return pooled(backend, tokenized_batches(folder, texts, max_length=128))


@pytest.mark.parametrize("arch", ARCHS)
def test_every_linear_runs_fused_and_matches_f_linear(tiny: Callable[..., Path], arch: str) -> None:
    # The pooling test_zoo uses: the same session checkpoint, built once.
    folder = tiny(arch, "embedding", "last_token" if arch in DECODERS else "mean")
    spec = load_model_spec(folder, ModelSettings(str(folder)))
    backend = TorchBackend(spec, "cpu", "float32")
    encoder = backend.model.encoder
    # The backend may have settled on F.linear by timing both (passes.pick_linear_kernel):
    # the oneDNN path is tested here whichever is faster on this machine.
    encoder.fuse(True)
    linears = [m for m in encoder.modules() if isinstance(m, nn.Linear)]
    fused = fused_linears(encoder)
    assert linears and fused, f"{arch}: fuse() built nothing"
    # Every weight of the state dict's linear layers lives in exactly one fused GEMM.
    assert sum(f.weight.numel() for f in fused) == sum(m.weight.numel() for m in linears)
    assert len(fused) < len(linears) or arch == "modernbert", f"{arch}: nothing merged"
    assert onednn_supported(torch.float32), "this project's CPU builds always have oneDNN"
    assert all(f.onednn for f in fused), f"{arch}: a layer fell back to F.linear"

    calls: list[str] = []
    hooks = [m.register_forward_hook(lambda *_: calls.append("nn.Linear")) for m in linears]
    texts = [*mixed_texts(10, seed=7, long_share=0.3), "a", "Hello world!"]
    try:
        fast = _embed(backend, folder, texts)
        assert not calls, f"{arch}: the fused forward still ran {len(calls)} plain nn.Linear"
        encoder.fuse(False)
        assert not any(f.onednn for f in fused_linears(encoder))
        slow = _embed(backend, folder, texts)
        # The plain path: every module back on its nn.Linear children.
        for module in encoder.modules():
            if getattr(module, "fused", None) is not None:
                module.fused = None
        plain = _embed(backend, folder, texts)
        assert calls, f"{arch}: the plain forward ran no nn.Linear"
    finally:
        for hook in hooks:
            hook.remove()
    assert_close_vectors(
        fast, slow, min_cos=0.99999, max_abs=1e-4, what=f"{arch} oneDNN vs F.linear"
    )
    assert_close_vectors(
        slow, plain, min_cos=0.99999, max_abs=1e-5, what=f"{arch} fused vs plain modules"
    )


@pytest.mark.parametrize("arch", ARCHS)
def test_int8_serves_every_native_architecture(tiny: Callable[..., Path], arch: str) -> None:
    folder = tiny(arch, "embedding", "last_token" if arch in DECODERS else "mean")
    spec = load_model_spec(folder, ModelSettings(str(folder)))
    texts = [*mixed_texts(12, seed=5, long_share=0.3), "a", "Hello world!"]
    want = _embed(TorchBackend(spec, "cpu", "float32"), folder, texts)
    backend = TorchBackend(spec, "cpu", "int8")
    linears = fused_linears(backend.model.encoder)
    assert linears and all(lin.int8 is not None for lin in linears), f"{arch}: not quantized"
    # The float32 copies int8 no longer reads are freed, and nothing needed them.
    plain = [m for m in backend.model.encoder.modules() if isinstance(m, nn.Linear)]
    assert all(lin.weight.numel() == 0 for lin in linears), f"{arch}: float weights kept"
    assert all(m.weight.numel() == 0 for m in plain), f"{arch}: nn.Linear weights kept"
    got = _embed(backend, folder, texts)
    assert not np.allclose(got, want, atol=1e-6), f"{arch}: not int8 at all"
    assert_close_vectors(got, want, min_cos=0.99, what=f"{arch} int8 vs fp32")
