"""Attention over packed sequences.

Queries, keys and values arrive flat, `(total_tokens, heads, head_dim)`, with sequence bounds in
`cu_seqlens`. On the CPU, sequences of equal length are gathered into one
`scaled_dot_product_attention` call each: no padding, few calls. Every path here is tested
against one explicit softmax per sequence (tests/helpers/attention.py).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from vectorpress.backends.common.sequences import LengthGroup, PackedSequences
from vectorpress.backends.torch.cpu_kernels import current


def _mask(
    length: int, causal: bool, window: int | None, device: torch.device
) -> torch.Tensor | None:
    if window is None:
        return None
    pos = torch.arange(length, device=device)
    dist = pos.unsqueeze(0) - pos.unsqueeze(1)
    mask = dist.abs() <= window // 2
    if causal:
        mask &= dist <= 0
    return mask


ScoreBias = Callable[[int, torch.dtype], torch.Tensor]
"""`bias(L, dtype)`: an additive `(heads, L, L)` score bias for sequences of length L, in `dtype`
(the model's, or float32 where attention widens it); the model keeps one per length and dtype for
all its layers, so that no layer casts it again. It depends on j - i only (MPNet's relative
positions): the compiled kernels read a shorter sequence's from a longer one's top-left corner."""


def _with_bias(
    mask: torch.Tensor | None,
    bias: ScoreBias | None,
    length: int,
    causal: bool,
    dtype: torch.dtype,
) -> torch.Tensor | None:
    """The boolean mask alone, or the additive bias with masked places at -inf, as
    `(1, heads, L, L)`: the CPU's flash kernel takes a mask of two or four dimensions only and
    sends a three-dimensional one to the unfused math kernel (all-mpnet-base-v2's pass: 42% of
    its time in bfloat16 there, against the flash kernel's 1.2-1.6x faster calls)."""
    if bias is None:
        return mask
    add = bias(length, dtype).unsqueeze(0)
    if mask is None and causal:
        mask = torch.ones(length, length, dtype=torch.bool, device=add.device).tril()
    if mask is not None:
        add = add.masked_fill(~mask, float("-inf"))
    return add


def _with_keys(
    mask: torch.Tensor | None, keys: torch.Tensor, length: int, causal: bool
) -> torch.Tensor:
    """`mask` (boolean, or an additive bias) with the held-out keys masked as well."""
    if mask is None:
        if not causal:
            return keys
        mask = torch.ones(length, length, dtype=torch.bool, device=keys.device).tril()
    if mask.dtype == torch.bool:
        return mask & keys
    return mask.masked_fill(~keys, float("-inf"))


def packed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seqs: PackedSequences,
    *,
    causal: bool = False,
    window: int | None = None,
    scale: float | None = None,
    bias: ScoreBias | None = None,
) -> torch.Tensor:
    """Attention within each sequence; q, k, v and the result are (total_tokens, heads, dim).

    k and v may have fewer heads than q (grouped-query attention); `window` is a symmetric
    local window (ModernBERT's) measured in tokens, half on each side. `bias` gives an additive
    score bias per sequence length (MPNet's relative positions; see `ScoreBias`).
    """
    kernel = current().attention
    if kernel is not None and window is None and not causal:
        out = kernel(q, k, v, seqs, scale, bias)
        if out is not None:
            return out
    n_heads, kv_heads = q.shape[1], k.shape[1]
    gqa = n_heads != kv_heads
    if seqs.varlen and bias is None and (window is None or "window_size" in varlen_parameters()):
        return varlen_attention(q, k, v, seqs, causal=causal, window=window, scale=scale)
    # A score bias in bfloat16 runs in float32 on the CPU: on the flash kernel in bfloat16,
    # all-mpnet-base-v2 fell to cosine 0.9972 to float32 on one corpus text (12 tokens), where
    # float32 attention holds the bound, and its 64-wide heads run no slower for the casts.
    on_cpu = q.device.type == "cpu"
    widen = bias is not None and on_cpu and q.dtype != torch.float32
    dtype = torch.float32 if widen else q.dtype
    out = torch.empty_like(q)
    for group in seqs.groups:
        L, n = group.length, group.count
        if group.filler:
            out[group.start : group.start + L] = 0
            continue
        keys = group.keys
        banded = window is not None and bias is None and keys is None and banded_from(window) <= L
        span = key_span(L, dtype) if on_cpu and not banded else L
        # (n, heads, L or span, dim)
        qg = _grouped(q, group, L)
        kg, vg = _grouped(k, group, span), _grouped(v, group, span)
        if banded:
            assert window is not None
            o = _banded(qg, kg, vg, window, causal=causal, scale=scale, gqa=gqa)
            _out_rows(out, group, o.transpose(1, 2).reshape(n * L, n_heads, -1))
            continue
        mask = _with_bias(_mask(L, causal, window, q.device), bias, L, causal, dtype)
        if keys is not None:
            mask = _with_keys(mask, keys, L, causal)
        # A causal call without a mask needs none for padded keys: with more keys than queries,
        # SDPA's causal mask is the top-left one, and no query reaches past its own position.
        if span != L and (mask is not None or not causal):
            mask = _span_mask(mask, L, span, q.device)
        if widen:
            qg, kg, vg = qg.float(), kg.float(), vg.float()
        o = F.scaled_dot_product_attention(
            qg,
            kg,
            vg,
            attn_mask=mask,
            is_causal=causal and mask is None,
            scale=scale,
            enable_gqa=gqa,
        )
        _out_rows(out, group, o.transpose(1, 2).reshape(n * L, n_heads, -1))
    return out


_KEY_BLOCK = 16
_PAD_FROM_REDUCED = 4
_PAD_FROM_FP32 = 6


def _pads_keys() -> bool:
    """Whether `key_span` pads here: where ATen's kernels run 512-bit vectors. With its AVX2
    kernels (`ATEN_CPU_CAPABILITY=avx2` on the same Xeon, float32) the key tail cost far less:
    padding to 16 ranged from 0.88x to 1.21x by remainder, level overall."""
    return torch.backends.cpu.get_cpu_capability() == "AVX512"


PADS_KEYS = _pads_keys()


def key_span(length: int, dtype: torch.dtype) -> int:
    """How many keys the CPU's flash kernel is given for sequences of `length` tokens: the
    length itself, or the next multiple of 16 with the keys after `length` masked.

    The kernel's keys past a multiple of 16 cost nearly as much as a whole block of them (the
    queries' count does not matter). Measured on an AMX Xeon, 12 heads of 32, 2 sequences a
    call, every length to 256: 15 keys past a multiple took 1.6x (bfloat16) and 1.56x
    (float32) the padded call's time on average, 4 past it 1.18x / 1.03x, 1-2 past it up to
    1.08x / 0.92x; 64-wide heads with a score bias, a window's mask or causal, alike. So keys
    are padded from 4 (reduced precision) or 6 (float32) past the multiple, on CPUs whose
    ATen kernels are AVX-512 ones (`PADS_KEYS`).
    """
    over = length % _KEY_BLOCK
    if (
        not PADS_KEYS
        or over == 0
        or over < (_PAD_FROM_FP32 if dtype == torch.float32 else _PAD_FROM_REDUCED)
    ):
        return length
    return length - over + _KEY_BLOCK


def _grouped(t: torch.Tensor, group: LengthGroup, span: int) -> torch.Tensor:
    """A group's rows of `t` (queries, keys or values) as `(n, heads, span, dim)`.

    With `span` past the length (keys, `key_span`), each sequence's own rows come first, then
    `span - length` rows that the mask holds out (`_span_mask`), whose values need only be
    finite. Sequences side by side are one view of the rows, overlapping the rows after them
    where the span reaches past a sequence: no copy. Otherwise they are gathered, and zero-padded
    to the span."""
    n, length = group.count, group.length
    if group.index is None and group.start + (n - 1) * length + span <= t.shape[0]:
        rows = t[group.start :]
        stride = rows.stride()
        view = rows.as_strided((n, span, *t.shape[1:]), (length * stride[0], *stride))
        return view.transpose(1, 2)
    end = group.start + n * length
    rows = t[group.start : end] if group.index is None else t[group.index]
    grouped = rows.reshape(n, length, *t.shape[1:]).transpose(1, 2)
    return grouped if span == length else F.pad(grouped, (0, 0, 0, span - length))


def _span_mask(
    mask: torch.Tensor | None, length: int, span: int, device: torch.device
) -> torch.Tensor:
    """`mask` (None, boolean, or an additive bias; its last dimension the keys) widened to
    `span` keys, the added ones held out."""
    if mask is None:
        return _key_limit(length, span, device)
    if mask.dtype == torch.bool:
        return F.pad(mask, (0, span - length), value=False)
    return F.pad(mask, (0, span - length), value=float("-inf"))


@functools.lru_cache(maxsize=256)
def _key_limit(length: int, span: int, device: torch.device) -> torch.Tensor:
    """`(1, 1, 1, span)`: the first `length` keys. Kept, as every layer asks for the same
    ones; SDPA only reads it."""
    return (torch.arange(span, device=device) < length).view(1, 1, 1, span)


def _out_rows(out: torch.Tensor, group: LengthGroup, rows: torch.Tensor) -> None:
    """Write a group's attention output back to its sequences' token rows (in `out`'s dtype:
    a widened attention's float32 rows go back to bfloat16, which an index put will not cast)."""
    if group.index is None:
        out[group.start : group.start + group.count * group.length] = rows
    else:
        out[group.index] = rows.to(out.dtype)


def banded_from(window: int) -> int:
    """The sequence length from which local attention runs in blocks (`_banded`).

    Measured on 4,096-token passes of equal lengths (12 heads of 64, window 128): one masked
    call 48 ms at 512 tokens against 39 in blocks, 220 against 42 at 2,048, 2,275 against 86
    at 8,192; level at 384, slower below. With window 16 (4 heads of 16) blocks won from 128.
    """
    return max(4 * _block(window), 128)


def _block(window: int) -> int:
    return max(window, 16)


def _banded(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    *,
    causal: bool,
    scale: float | None,
    gqa: bool,
) -> torch.Tensor:
    """Attention of tokens on the tokens within `window // 2` of them (and before them only,
    if `causal`), for `(n, heads, L, dim)` inputs, in blocks of queries, each on the keys its
    block can reach: L x (block + window) scores instead of L x L.

    With one masked SDPA call over the whole sequence, a ModernBERT local layer (window 128) on
    an 8,192-token text took longer than a global one (2.2 s against 1.5 s a layer, and 1.4 GB
    for the mask and its index arithmetic); in blocks it is a few percent of that.
    """
    n, heads, length, dim = q.shape
    kv_heads = k.shape[1]
    half = window // 2
    block = _block(window)
    blocks = -(-length // block)
    span = block + 2 * half
    padded = blocks * block
    # Queries in blocks: (n * blocks, heads, block, dim).
    qb = F.pad(q, (0, 0, 0, padded - length))
    qb = qb.view(n, heads, blocks, block, dim).transpose(1, 2).reshape(-1, heads, block, dim)

    def windows(t: torch.Tensor) -> torch.Tensor:
        # Keys from `half` before each block to `half` after it: (n * blocks, kv, span, dim).
        t = F.pad(t, (0, 0, half, padded - length + half))
        t = t.unfold(2, span, block)  # (n, kv, blocks, dim, span)
        return t.permute(0, 2, 1, 4, 3).reshape(-1, kv_heads, span, dim)

    # Key j of block b sits at b * block - half + j; query i at b * block + i.
    i = torch.arange(block, device=q.device).unsqueeze(1)
    j = torch.arange(span, device=q.device).unsqueeze(0)
    dist = j - half - i
    near = dist.abs() <= half
    if causal:
        near &= dist <= 0
    start = torch.arange(blocks, device=q.device).view(blocks, 1, 1) * block
    key_pos = start - half + j
    query_pos = start + i
    # Padding keys are never seen; padding queries (dropped after) see everything, so that
    # no row is empty.
    mask = (near & (key_pos >= 0) & (key_pos < length)) | (query_pos >= length)
    mask = mask.unsqueeze(1).expand(blocks, 1, block, span)
    mask = mask.unsqueeze(0).expand(n, -1, -1, -1, -1).reshape(-1, 1, block, span)
    o = F.scaled_dot_product_attention(
        qb, windows(k), windows(v), attn_mask=mask, scale=scale, enable_gqa=gqa
    )
    o = o.view(n, blocks, heads, block, dim).transpose(1, 2).reshape(n, heads, padded, dim)
    return o[:, :, :length]


@functools.cache
def varlen_parameters() -> frozenset[str]:
    """The parameters of this torch's varlen_attn; empty where it has none.

    Its signature grew across releases: torch 2.9 takes `is_causal` and no scale, a later one
    `scale` and `window_size` (keyword-only, no `is_causal`), a later one `enable_gqa` too. Each
    call passes what this one takes and does the rest itself (`varlen_attention`).
    """
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return frozenset()
    return frozenset(inspect.signature(varlen_attn).parameters)


def varlen_usable(device: str, dtype: torch.dtype) -> tuple[bool, str]:
    """Whether FlashAttention through varlen_attn can run here, and why (for the start-up log).

    FlashAttention takes float16 / bfloat16 on CUDA only; elsewhere the SDPA path serves.
    """
    if not device.startswith("cuda"):
        return False, "not on CUDA"
    if dtype not in (torch.float16, torch.bfloat16):
        return False, f"FlashAttention needs float16 or bfloat16, not {dtype}"
    params = varlen_parameters()
    if not params:
        return False, "torch has no torch.nn.attention.varlen"
    if not {"window_size", "is_causal"} & params:
        return False, "this torch's varlen_attn takes neither window_size nor is_causal"
    if "window_size" not in params:
        return True, "FlashAttention on cu_seqlens; windowed layers on SDPA (no window_size)"
    return True, "FlashAttention on cu_seqlens"


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seqs: PackedSequences,
    *,
    causal: bool = False,
    window: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """The whole packed batch in one FlashAttention call on `cu_seqlens`: no gathers, no masks.

    `window` keeps the meaning it has in packed_attention (|distance| <= window // 2); Flash's
    `(left, right)` window counts tokens on each side, and a causal one has no right side.
    """
    from torch.nn.attention.varlen import varlen_attn

    params = varlen_parameters()
    options: dict[str, Any] = {}
    if "window_size" in params:
        left = -1 if window is None else window // 2
        options["window_size"] = (left, 0 if causal else left)
    elif window is not None:
        raise ValueError("this torch's varlen_attn has no window_size (use packed_attention)")
    else:
        options["is_causal"] = causal
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in params:
            options["enable_gqa"] = True
        else:
            # Query head h reads key head h // group, as enable_gqa (and SDPA's) would.
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    if scale is not None:
        if "scale" in params:
            options["scale"] = scale
        else:
            # Its own scale is 1/sqrt(head_dim): the queries carry the difference.
            q = q * (scale * math.sqrt(q.shape[-1]))
    cu = seqs.cu_seqlens.to(torch.int32)
    max_len = seqs.max_seqlen
    out = varlen_attn(q, k, v, cu, cu, max_len, max_len, **options)
    assert isinstance(out, torch.Tensor)  # a tuple only with return_aux
    return out
