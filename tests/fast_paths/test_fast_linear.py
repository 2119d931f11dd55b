"""The oneDNN linear path gives the same numbers as F.linear, layer by layer and end to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.helpers.cpu import needs_onednn
from tests.helpers.reference import assert_close_vectors, st_encode
from tests.helpers.texts import mixed_texts
from vectorpress.backends.common.threads import num_threads
from vectorpress.backends.torch.backend import TorchBackend
from vectorpress.backends.torch.layers import _ONEDNN_POSTOPS, FusedLinear, onednn_supported
from vectorpress.model_spec import load_model_spec
from vectorpress.settings import ModelSettings
from vectorpress.types import Batch, Encoding


def _encodings(folder: Path, texts: list[str]) -> list[Encoding]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(256)
    return [Encoding(ids=e.ids, type_ids=e.type_ids) for e in tok.encode_batch(texts)]


def _embed(backend: TorchBackend, encodings: list[Encoding]) -> np.ndarray:
    out = backend.embed(Batch.from_encodings(encodings))
    assert out.pooled is not None
    return out.pooled


@needs_onednn
@pytest.mark.parametrize("act", [None, *_ONEDNN_POSTOPS])
def test_packed_linear_matches_f_linear(act: str | None) -> None:
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(96, 64, generator=gen) / 8
    bias = torch.randn(96, generator=gen)
    x = torch.randn(37, 64, generator=gen)
    fast = FusedLinear(weight, bias, act)
    slow = FusedLinear(weight, bias, act, fast=False)
    assert not slow.onednn
    # On this project's CPU builds oneDNN is always there: a silent fallback would hide a
    # regression of the fast path, so it must really be engaged.
    assert fast.onednn == onednn_supported(torch.float32)
    assert fast.onednn
    want = F.linear(x, weight, bias)
    if act is not None:
        want = {"gelu": F.gelu, "relu": F.relu, "tanh": torch.tanh}.get(
            act, slow.act or (lambda t: t)
        )(want)
    torch.testing.assert_close(slow(x), want)
    torch.testing.assert_close(fast(x), want, rtol=1e-4, atol=1e-5)


def test_unknown_activation_falls_back_unfused() -> None:
    weight, bias = torch.randn(8, 4), torch.randn(8)
    layer = FusedLinear(weight, bias, "identity")
    x = torch.randn(3, 4)
    torch.testing.assert_close(layer(x), F.linear(x, weight, bias), rtol=1e-4, atol=1e-5)


@needs_onednn
def test_fast_model_matches_the_f_linear_model_and_sentence_transformers(minilm: Path) -> None:
    spec = load_model_spec(minilm, ModelSettings(str(minilm)))
    backend = TorchBackend(spec, "cpu", "float32")
    backend.model.encoder.fuse(True)
    layer = backend.model.encoder.encoder.layer[0]
    assert layer.fused is not None and layer.fused.ffn_in.onednn
    texts = mixed_texts(48, seed=3)
    encodings = _encodings(minilm, texts)
    fast = _embed(backend, encodings)
    backend.model.encoder.fuse(fast=False)
    assert not backend.model.encoder.encoder.layer[0].fused.ffn_in.onednn
    slow = _embed(backend, encodings)
    assert_close_vectors(fast, slow, min_cos=0.999999, max_abs=1e-4, what="oneDNN vs F.linear")
    norm = fast / np.linalg.norm(fast, axis=1, keepdims=True)
    assert_close_vectors(norm, st_encode(minilm, texts), min_cos=0.99999, what="vs ST")


def test_a_big_batch_in_several_cpu_passes_equals_one_pass(
    minilm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches over the pass size run as several passes; the vectors must not change."""
    from vectorpress.backends.common.sequences import PackedSequences
    from vectorpress.backends.torch import passes as passes_module

    spec = load_model_spec(minilm, ModelSettings(str(minilm)))
    backend = TorchBackend(spec, "cpu", "float32")
    encodings = _encodings(minilm, mixed_texts(60, seed=5))
    total = sum(len(e) for e in encodings)
    assert total > 1000
    cut = passes_module.cpu_passes(
        PackedSequences(torch.from_numpy(Batch.from_encodings(encodings).cu_seqlens), 256), 1000
    )
    assert len(cut) >= 2 and cut[-1].end == total
    assert all(p.seqs.total <= 1000 or p.seqs.size == 1 for p in cut)
    one = _embed(backend, encodings)
    calls: list[int] = []
    real = passes_module.cpu_passes

    def spy(seqs: PackedSequences, max_tokens: int) -> list[passes_module.PassSlice]:
        out = real(seqs, max_tokens)
        calls.append(len(out))
        return out

    backend.passes.max_tokens = 1000
    monkeypatch.setattr(passes_module, "cpu_passes", spy)
    several = _embed(backend, encodings)
    assert calls and calls[0] >= 2
    assert_close_vectors(several, one, min_cos=0.999999, max_abs=1e-5, what="passes vs one")
    # A short query runs on the thread count planned for short passes: the same vector, every
    # time to the last bit, and the caller's thread count is left as it was.
    threads = torch.get_num_threads()
    alone = [_embed(backend, encodings[:1]) for _ in range(3)]
    assert torch.get_num_threads() == threads
    assert all(np.array_equal(vec, alone[0]) for vec in alone)
    assert_close_vectors(alone[0], one[:1], min_cos=0.999999, max_abs=1e-5, what="alone")


@needs_onednn
def test_kernels_and_threads_are_planned_by_timing_the_model(
    minilm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from vectorpress.backends.torch import layers, passes
    from vectorpress.backends.torch.passes import PassPlan, plan_passes

    spec = load_model_spec(minilm, ModelSettings(str(minilm)))
    backend = TorchBackend(spec, "cpu", "float32")
    encoder = backend.model.encoder
    # Both kernels stay ready; each pass takes the one planned for its size.
    assert encoder.encoder.layer[0].fused.ffn_in.onednn
    real_fallback, real_call = FusedLinear._fallback, FusedLinear.__call__

    def slow_f_linear(self, x):  # type: ignore[no-untyped-def]
        time.sleep(0.01)
        return real_fallback(self, x)

    def slow_onednn(self, x):  # type: ignore[no-untyped-def]
        if self.packed is not None and layers._kernel.onednn:
            time.sleep(0.01)
        return real_call(self, x)

    def slow_on_one_thread(self, x):  # type: ignore[no-untyped-def]
        if torch.get_num_threads() == 1:
            time.sleep(0.01)
        return real_call(self, x)

    def slow_on_many(self, x):  # type: ignore[no-untyped-def]
        if torch.get_num_threads() > 1:
            time.sleep(0.01)
        return real_call(self, x)

    def plan(**patch: object) -> PassPlan:
        # At least two threads, so that "one" and "all" differ; the count is restored after.
        with monkeypatch.context() as m, num_threads(max(2, torch.get_num_threads())):
            for name, fn in patch.items():
                m.setattr(FusedLinear, name, fn)
            return plan_passes(encoder, spec.position_offset)

    # The injected delays stand far above the noise of a loaded machine.
    assert plan(_fallback=slow_f_linear, __call__=slow_on_one_thread) == PassPlan(True, True)
    on_f_linear = plan(__call__=slow_onednn)
    assert (on_f_linear.small_onednn, on_f_linear.large_onednn) == (False, False)
    assert plan(__call__=slow_on_many).small_threads == 1

    # A pass runs the kernel and thread count planned for its size; larger passes keep every
    # thread, however start-up timed them.
    used: list[tuple[bool, int]] = []

    def spy(self, x):  # type: ignore[no-untyped-def]
        used.append((self.packed is not None and layers._kernel.onednn, torch.get_num_threads()))
        return real_call(self, x)

    monkeypatch.setattr(FusedLinear, "__call__", spy)
    encodings = _encodings(minilm, mixed_texts(20, seed=2))
    backend.passes = passes.CpuPasses(
        plan=PassPlan(small_onednn=True, large_onednn=False, small_threads=1)
    )
    with num_threads(2):
        _embed(backend, _encodings(minilm, ["a short query"]))
        assert used and all(u == (True, 1) for u in used)
        used.clear()
        _embed(backend, encodings)
        assert used and all(u == (False, 2) for u in used)


@needs_onednn
def test_padded_passes_give_the_vectors_of_exact_ones(minilm: Path) -> None:
    from vectorpress.backends.torch.passes import CpuPasses, PassPlan, bucket_rows

    spec = load_model_spec(minilm, ModelSettings(str(minilm)))
    backend = TorchBackend(spec, "cpu", "float32")
    backend.model.encoder.fuse(True)
    encodings = _encodings(minilm, mixed_texts(30, seed=11))
    query = _encodings(minilm, ["where is the nearest train station today"])
    batches = [query, query + query[:1], encodings[:3], encodings[3:9], encodings]
    sizes = [sum(len(e) for e in b) for b in batches]
    # Short passes and larger ones both get filler rows.
    assert bucket_rows(sizes[0]) > sizes[0] and sizes[0] < 64, sizes
    assert any(bucket_rows(n) > n for n in sizes[2:]), sizes

    # Only F.linear runs rows as they come.
    backend.passes = CpuPasses(plan=PassPlan(small_onednn=False, large_onednn=False))
    exact = [_embed(backend, b) for b in batches]
    backend.passes = CpuPasses(plan=PassPlan(small_onednn=True, large_onednn=True))
    padded = [_embed(backend, b) for b in batches]
    for want, got in zip(exact, padded, strict=True):
        assert got.shape == want.shape
        assert_close_vectors(got, want, min_cos=0.999999, max_abs=1e-5, what="padded pass")


@needs_onednn
def test_onednn_passes_run_at_a_bounded_set_of_row_counts() -> None:
    from vectorpress.backends.torch.passes import CPU_PASS_TOKENS, bucket_rows

    rows = [bucket_rows(n) for n in range(1, CPU_PASS_TOKENS + 1)]
    assert all(r >= n for n, r in enumerate(rows, start=1))
    assert all(r - n <= max(15, n // 8) for n, r in enumerate(rows, start=1))
    assert {bucket_rows(n) for n in range(1, 64)} == {4, 8, 12, 16, 20, 24, 28, 32, 48, 64}
    assert len(set(rows)) <= 60
