"""Every native model beyond BERT runs all its linear layers on FusedLinear, on oneDNN where this
CPU has it, and gives the vectors of the portable F.linear path (`fuse(False)`); with --dtype int8
every one of them is quantized and stays within cosine 0.99 of float32. (Both paths run the one
forward of each model file, whose parity with transformers test_zoo checks.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from tests.helpers.batches import pooled, tokenized_batches
from tests.helpers.cpu import needs_fbgemm, needs_onednn
from tests.helpers.reference import assert_close_vectors
from tests.helpers.texts import mixed_texts
from tests.models.test_zoo import DECODERS
from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.torch.backend import TorchBackend
from vectorpress.backends.torch.layers import fused_linears
from vectorpress.model_spec import load_model_spec
from vectorpress.settings import ModelSettings

ARCHS = ("distilbert", "mpnet", "modernbert", "qwen2", "qwen3", "mistral", "llama", "gemma3_text")


def _embed(backend: TorchBackend, folder: Path, texts: list[str]) -> np.ndarray:
    return pooled(backend, tokenized_batches(folder, texts, max_length=128))


@needs_onednn
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
        assert not calls, f"{arch}: the F.linear forward ran {len(calls)} plain nn.Linear"
    finally:
        for hook in hooks:
            hook.remove()
    assert_close_vectors(
        fast, slow, min_cos=0.99999, max_abs=1e-4, what=f"{arch} oneDNN vs F.linear"
    )


def test_a_model_run_before_fuse_says_so(tiny: Callable[..., Path]) -> None:
    from vectorpress.backends.torch.backend import build_model
    from vectorpress.backends.torch.registry import lookup

    folder = tiny("qwen2", "embedding", "last_token")
    spec = load_model_spec(folder, ModelSettings(str(folder)))
    arch = lookup(spec.model_type)
    assert arch is not None
    model = build_model(spec, arch)
    batch = tokenized_batches(folder, ["a"])[0]
    seqs = PackedSequences(torch.from_numpy(batch.cu_seqlens), batch.max_seqlen)
    ids = torch.from_numpy(batch.input_ids)
    with pytest.raises(RuntimeError, match="fuse"):
        model.encoder(ids, ids, torch.from_numpy(batch.position_ids), seqs)


@needs_fbgemm
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
