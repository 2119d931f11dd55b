"""Packed attention (grouped by length) against one explicit softmax per sequence."""

from __future__ import annotations

import itertools

import pytest
import torch

from tests.helpers.attention import allowed, packed, reference_attention
from vectorpress.backends.common.pooling import pool
from vectorpress.backends.common.sequences import LengthGroup, PackedSequences
from vectorpress.backends.torch import attention
from vectorpress.backends.torch.attention import banded_from, packed_attention


def _check_against_reference(
    lengths: list[int], kv_heads: int, causal: bool, window: int | None
) -> None:
    """Random q, k, v for packed sequences of `lengths`, 4 query heads of 8: the packed path
    against one explicit softmax per sequence."""
    seqs = packed(lengths)
    total = sum(lengths)
    q = torch.randn(total, 4, 8)
    k = torch.randn(total, kv_heads, 8)
    v = torch.randn(total, kv_heads, 8)
    fast = packed_attention(q, k, v, seqs, causal=causal, window=window)
    slow = reference_attention(q, k, v, seqs, causal=causal, window=window)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_packed_matches_reference(causal: bool, window: int | None, kv_heads: int) -> None:
    torch.manual_seed(0)
    lengths = [5, 3, 5, 1, 8, 3]
    _check_against_reference(lengths, kv_heads, causal, window)


def test_the_reference_mask_is_the_definition() -> None:
    """The reference's own mask, on a case small enough to read: a causal window of 4 keeps
    the query and the two keys before it."""
    want = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [0, 1, 1, 1, 0],
            [0, 0, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(allowed(5, causal=True, window=4), want)
    assert torch.equal(allowed(5, causal=False, window=4), want | want.T)
    assert allowed(5, causal=False, window=None).all()


def test_pooling_methods_on_packed_states() -> None:
    hidden = torch.arange(12, dtype=torch.float32).reshape(6, 2)
    seqs = PackedSequences(torch.tensor([0, 2, 6], dtype=torch.int32), 4)
    torch.testing.assert_close(pool(hidden, seqs, "cls"), hidden[[0, 2]])
    torch.testing.assert_close(pool(hidden, seqs, "last_token"), hidden[[1, 5]])
    torch.testing.assert_close(
        pool(hidden, seqs, "mean"), torch.stack([hidden[:2].mean(0), hidden[2:].mean(0)])
    )
    torch.testing.assert_close(pool(hidden, seqs, "mean", [1]), hidden[2:].mean(0, keepdim=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_text_is_mean_pooled_as_in_a_batch(dtype: torch.dtype) -> None:
    # One pooled text takes a slice's sum; a batch takes index_add_ over segment ids.
    torch.manual_seed(0)
    hidden = torch.randn(23, 384).to(dtype)
    batch = PackedSequences(torch.tensor([0, 9, 23], dtype=torch.int32), 14)
    together = pool(hidden, batch, "mean")
    for i, (start, stop) in enumerate([(0, 9), (9, 23)]):
        alone = PackedSequences(torch.tensor([0, stop - start], dtype=torch.int32), stop - start)
        one = pool(hidden[start:stop], alone, "mean")
        assert one.shape == (1, 384) and one.dtype == dtype
        torch.testing.assert_close(one, together[i : i + 1])
        torch.testing.assert_close(pool(hidden, batch, "mean", [i]), one, rtol=0, atol=0)
        want = hidden[start:stop].double().mean(0, keepdim=True)
        torch.testing.assert_close(
            one.double(), want, **({} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2})
        )


def test_a_filler_sequence_is_a_sequence_of_its_own() -> None:
    torch.manual_seed(0)
    cu = torch.tensor([0, 5, 8, 13], dtype=torch.int32)
    seqs = PackedSequences(cu, 5).with_filler(20)
    fresh = PackedSequences(torch.tensor([0, 5, 8, 13, 20], dtype=torch.int32), 7)
    assert (seqs.starts, seqs.lengths, seqs.total, seqs.max_seqlen, seqs.size) == (
        fresh.starts,
        fresh.lengths,
        fresh.total,
        fresh.max_seqlen,
        fresh.size,
    )
    torch.testing.assert_close(seqs.cu_seqlens, fresh.cu_seqlens)
    q, k, v = (torch.randn(20, 4, 8) for _ in range(3))
    # The real rows do not see the filler's, however the filler is filled; the filler's own
    # rows are dropped after the pass, so attention leaves them at zero without a call.
    padded = packed_attention(q, k, v, seqs)
    assert not padded[13:].any()
    k2, v2 = k.clone(), v.clone()
    k2[13:], v2[13:] = 100.0, -100.0
    torch.testing.assert_close(packed_attention(q, k2, v2, seqs)[:13], padded[:13])
    real = PackedSequences(cu, 5)
    torch.testing.assert_close(
        padded[:13], reference_attention(q[:13], k[:13], v[:13], real), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [4, 7, 16])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_long_local_attention_in_blocks_matches_reference(
    causal: bool, window: int, kv_heads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sequences long enough for the blocked path (some of one length, one of several blocks
    plus a remainder, one exactly at the threshold) and short ones, in one pass."""
    torch.manual_seed(0)
    start = banded_from(window)
    lengths = [start + 37, 9, start, start + 37, 3 * start + 5, 40]
    blocked: list[int] = []
    real = attention._banded

    def spy(q: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        blocked.append(q.shape[2])
        return real(q, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(attention, "_banded", spy)
    _check_against_reference(lengths, kv_heads, causal, window)
    assert sorted(blocked) == sorted({n for n in lengths if n >= start})


def test_sequences_sorted_longest_first_attend_as_one_view_per_length() -> None:
    """A batch put longest first: equal lengths side by side, each length one group read as a
    view (no gather), the attention still that of each sequence on its own."""
    torch.manual_seed(0)
    lengths = [5, 3, 8, 5, 1, 3, 5]
    arrival = packed(lengths, key_lengths=[5, 2, 8, 5, 1, 3, 4])
    sorted_ = arrival.longest_first()
    assert sorted_ is not None
    tokens, seqs = sorted_
    assert seqs.lengths == [8, 5, 5, 5, 3, 3, 1]
    # Equal lengths keep their order: the 5s are sequences 0, 3 and 6, the 3s 1 and 5.
    starts = [0, 5, 8, 16, 21, 22, 25]
    order = [2, 0, 3, 6, 1, 5, 4]
    want = torch.cat([torch.arange(starts[i], starts[i] + lengths[i]) for i in order])
    assert torch.equal(tokens, want)
    assert seqs.key_lengths == [8, 5, 5, 4, 2, 3, 1]
    assert [(g.length, g.count, g.index) for g in seqs.groups] == [
        (8, 1, None),
        (5, 3, None),
        (3, 2, None),
        (1, 1, None),
    ]
    assert seqs.longest_first() is None
    sorted_ = packed(lengths).longest_first()
    assert sorted_ is not None
    tokens, seqs = sorted_
    q, k, v = (torch.randn(sum(lengths), 4, 8)[tokens] for _ in range(3))
    fast = packed_attention(q, k, v, seqs)
    torch.testing.assert_close(fast, reference_attention(q, k, v, seqs), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("held_out_keys", [False, True])
def test_a_score_bias_runs_on_the_fused_kernel(held_out_keys: bool) -> None:
    """MPNet's relative position bias, with and without held-out keys: the same attention as the
    reference, on the CPU's flash kernel (a mask it does not take falls back to the unfused
    math kernel, which allowing only flash makes an error)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    lengths = [5, 3, 5, 8]
    keys = [4, 3, 5, 6] if held_out_keys else None
    seqs = packed(lengths, key_lengths=keys)
    q, k, v = (torch.randn(sum(lengths), 4, 8) for _ in range(3))
    table = torch.randn(4, 15)
    asked: set[torch.dtype] = set()

    def bias(length: int, dtype: torch.dtype) -> torch.Tensor:
        asked.add(dtype)
        pos = torch.arange(length)
        return table[:, (pos.unsqueeze(0) - pos.unsqueeze(1)) + 7].to(dtype)

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        fast = packed_attention(q, k, v, seqs, bias=bias)
    slow = reference_attention(q, k, v, seqs, bias=bias)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
    # A bfloat16 model's biased attention runs in float32 on the CPU, and asks for the bias so
    # (the model keeps it per length and dtype for every layer): no bfloat16 copy is made.
    asked.clear()
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        half = packed_attention(*(t.bfloat16() for t in (q, k, v)), seqs, bias=bias)
    assert asked == {torch.float32} and half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), slow, atol=2e-2, rtol=2e-2)


@pytest.fixture
def pads_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Key padding on, whatever ATen's vector width here (it is on for AVX-512 only)."""
    monkeypatch.setattr(attention, "PADS_KEYS", True)


def test_keys_are_padded_only_where_aten_runs_avx512(monkeypatch: pytest.MonkeyPatch) -> None:
    assert attention._pads_keys() == (torch.backends.cpu.get_cpu_capability() == "AVX512")
    monkeypatch.setattr(attention, "PADS_KEYS", False)
    assert attention.key_span(20, torch.bfloat16) == 20


@pytest.mark.usefixtures("pads_keys")
def test_key_span_pads_to_the_next_multiple_of_16_from_a_few_keys_past_it() -> None:
    assert [attention.key_span(n, torch.bfloat16) for n in (1, 3, 4, 16, 19, 20, 255, 256)] == [
        1,
        3,
        16,
        16,
        19,
        32,
        256,
        256,
    ]
    assert [attention.key_span(n, torch.float32) for n in (5, 6, 21, 22, 187)] == [
        5,
        16,
        21,
        32,
        192,
    ]


@pytest.mark.usefixtures("pads_keys")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sort", [True, False])
@pytest.mark.parametrize("held_out_keys", [False, True])
@pytest.mark.parametrize(("causal", "window"), [(False, None), (True, None), (False, 8), (True, 8)])
def test_keys_padded_to_a_span_attend_as_the_sequence_alone(
    dtype: torch.dtype,
    sort: bool,
    held_out_keys: bool,
    causal: bool,
    window: int | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Lengths whose keys the CPU path pads (`key_span`): sequences side by side with rows
    after them (read as one overlapping view), the last ones without (gathered), and, in
    arrival order, a length whose sequences lie apart (gathered by index). The rows a padded
    view reads past a sequence are its neighbours': held out by the mask (or, causal and
    unmasked, by SDPA's top-left causal mask), they change nothing; under a window too."""
    torch.manual_seed(0)
    lengths = [22, 45, 9, 45, 30, 22, 7]
    # Each sequence holds out at most 3 keys: under the window (4 on each side) every query
    # still sees one.
    keys = [19, 45, 6, 42, 30, 22, 7] if held_out_keys else None
    seqs = packed(lengths, key_lengths=keys)
    total = sum(lengths)
    q, k, v = (torch.randn(total, 4, 8) for _ in range(3))
    if sort:
        sorted_ = seqs.longest_first()
        assert sorted_ is not None
        tokens, seqs = sorted_
        q, k, v = q[tokens], k[tokens], v[tokens]
    spans: list[tuple[int, int]] = []
    real = attention._grouped

    def spy(t: torch.Tensor, group: LengthGroup, span: int) -> torch.Tensor:
        if span != group.length:
            spans.append((group.length, span))
        return real(t, group, span)

    monkeypatch.setattr(attention, "_grouped", spy)
    q, k, v = (t.to(dtype) for t in (q, k, v))
    fast = packed_attention(q, k, v, seqs, causal=causal, window=window)
    assert set(spans) == {(45, 48), (30, 32), (22, 32), (9, 16), (7, 16)}
    slow = reference_attention(q.float(), k.float(), v.float(), seqs, causal=causal, window=window)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(fast.float(), slow, atol=tol, rtol=tol)


# varlen_attn's signature across torch releases: the CUDA path adapts to each (it met the middle
# one on a GPU machine, whose torch refused enable_gqa). The stand-ins take exactly those
# parameters and compute what their arguments ask for, so a call that passes a parameter the
# release lacks fails as it would there, and one that passes the wrong window, scale or heads
# gives the wrong numbers.
def _flash_attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu: torch.Tensor,
    scale: float | None,
    window_size: tuple[int, int],
    enable_gqa: bool,
) -> torch.Tensor:
    assert cu.dtype == torch.int32
    assert q.shape[1] == k.shape[1] or enable_gqa, "grouped heads without enable_gqa"
    k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    left, right = window_size
    out = torch.empty_like(q)
    bounds = cu.tolist()
    for a, b in itertools.pairwise(bounds):
        qs, ks, vs = (t[a:b].transpose(0, 1) for t in (q, k, v))
        scores = qs @ ks.transpose(1, 2) * (q.shape[-1] ** -0.5 if scale is None else scale)
        pos = torch.arange(b - a)
        dist = pos.unsqueeze(0) - pos.unsqueeze(1)  # key - query
        ok = torch.ones(b - a, b - a, dtype=torch.bool)
        if left >= 0:
            ok &= dist >= -left
        if right >= 0:
            ok &= dist <= right
        out[a:b] = (scores.masked_fill(~ok, float("-inf")).softmax(-1) @ vs).transpose(0, 1)
    return out


def _varlen_is_causal_only(
    query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None
):  # type: ignore[no-untyped-def]
    return _flash_attend(query, key, value, cu_seq_q, None, (-1, 0 if is_causal else -1), False)


def _varlen_scale_and_window(
    query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
    window_size=(-1, -1),
):  # type: ignore[no-untyped-def]  # fmt: skip
    return _flash_attend(query, key, value, cu_seq_q, scale, window_size, False)


def _varlen_with_gqa(
    query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
    window_size=(-1, -1), enable_gqa=False, seqused_k=None, block_table=None, num_splits=None,
):  # type: ignore[no-untyped-def]  # fmt: skip
    return _flash_attend(query, key, value, cu_seq_q, scale, window_size, enable_gqa)


VARLEN_RELEASES = {
    "is_causal only": _varlen_is_causal_only,
    "scale and window_size": _varlen_scale_and_window,
    "enable_gqa too": _varlen_with_gqa,
}


@pytest.fixture(params=sorted(VARLEN_RELEASES))
def varlen_release(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    import torch.nn.attention.varlen as module

    monkeypatch.setattr(module, "varlen_attn", VARLEN_RELEASES[request.param])
    attention.varlen_parameters.cache_clear()
    yield request.param
    attention.varlen_parameters.cache_clear()


@pytest.mark.parametrize(("causal", "window"), [(False, None), (True, None), (False, 6)])
@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_varlen_attention_asks_each_release_for_what_it_can_do(
    varlen_release: str, causal: bool, window: int | None, kv_heads: int, scale: float | None
) -> None:
    torch.manual_seed(0)
    lengths = [9, 1, 14, 9]
    seqs = packed(lengths, varlen=True)
    total = sum(lengths)
    q = torch.randn(total, 4, 8)
    k, v = torch.randn(total, kv_heads, 8), torch.randn(total, kv_heads, 8)
    got = packed_attention(q, k, v, seqs, causal=causal, window=window, scale=scale)
    want = reference_attention(q, k, v, seqs, causal=causal, window=window, scale=scale)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    usable, why = attention.varlen_usable("cuda", torch.float16)
    assert usable
    windowed_on_sdpa = varlen_release == "is_causal only"
    assert ("windowed layers on SDPA" in why) == windowed_on_sdpa
    if window is not None and windowed_on_sdpa:
        with pytest.raises(ValueError, match="no window_size"):
            attention.varlen_attention(q, k, v, seqs, window=window)
