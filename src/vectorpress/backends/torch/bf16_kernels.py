"""Compiled ops for a bfloat16 model's CPU passes (`cpu_kernels.py`), from the short-pass
kernel's library (`short_kernel.c`): attention on AMX's tiles where the CPU has AMX, and the
post-LayerNorm layers' residual add and LayerNorm as one op on any AVX-512 CPU.

A bfloat16 pass on AMX spends more of its time outside the GEMMs than in them: in
all-MiniLM-L6-v2's pass (600 corpus texts in batches of 32, torch's profiler, the AMX Xeon)
ATen's flash kernel took 35-40% of it, the residual adds 7% and LayerNorm 6.5%.

The attention takes every sequence of a pass in one call (no length groups, no gathers, no
padding to a common length): it lays each sequence's queries, keys and values out as the tiles
read them (K transposed into pairs of dimensions, V's rows in pairs), reading the rows whole,
then hands the (sequence, head) pairs to the threads, each scoring 16 queries against 32 keys a
step on the tiles, its softmax over the whole row in float32 (the exponentials rounded to
bfloat16 for P V, as ATen's flash kernel rounds them; the next block's scores on the tiles while
the vector units run this block's softmax). On the AMX Xeon, over the corpus's 600 texts in
batches of 32 (12 heads of 32): 46-47 ms a layer against the grouped calls' 96-123 (11-12 of
them laying the rows out); by length (equal-length batches, 12 heads of 32): 1.5-2.0x from 16
to 1,000 tokens, 2.3-2.7x for one short text; heads of 64: 1.2-1.7x from 64 tokens, level at 33,
0.86x for 64 texts of 16 tokens. The whole pass (MiniLM, the same 600 texts, with the residual
step below): 45,300-46,300 tokens/s against 32,800-33,700, at the same lowest cosine to float32
(0.99989).

It fits attention without a window, a causal mask or held-out keys, with as many key heads as
query heads of 32 or 64 dimensions: BERT's, RoBERTa's, XLM-R's, DistilBERT's, and MPNet's with its
relative position bias. The bias stays float32, added to the float32 scores (torch's bfloat16
path widens MPNet's attention to float32 for its accuracy, casts included), and P goes to the
tiles in two bfloat16 parts, its rounding and what the rounding left off, which keeps P to about
2^-17: with P in one part, all-mpnet-base-v2's most sensitive corpus text fell to cosine 0.99712
to float32 (`tests/fast_paths/test_bfloat16.py` holds it at 0.999); in two, the lowest over 300
corpus texts is 0.99914 (the float32 attention's 0.99920), and the pass ran 6,985-7,254 tokens/s
against 4,721-4,727 (1.5x).

The residual step reads the linear's output and the residual once, rounds their sum to bfloat16
and writes its LayerNorm over the output, where torch's add and LayerNorm read and write the
rows three times: 295 us against 970-1,000 on 2,940 rows of 384 (one value in 70,000 a bfloat16
step apart, as LayerNorm's sums are ordered differently).
"""

from __future__ import annotations

import ctypes
import logging
import math
import weakref
from pathlib import Path

import torch
from torch import nn

from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.torch.attention import ScoreBias
from vectorpress.backends.torch.cpu_kernels import NONE, CpuKernels
from vectorpress.backends.torch.short_kernel import amx_ready, load_library

log = logging.getLogger(__name__)

HEAD_DIMS = (32, 64)
# A pass of many very short texts lays out several times its rows (each sequence in whole
# tiles of 32 keys), allocated per layer, and pays a task per text and head: measured on the
# AMX Xeon (12 heads, grouped calls against the kernel), 1,300 texts of 3 tokens ran 3.5x (heads
# of 32) and 5.5x (64) slower on the kernel, 400 of 10 tokens 1.14x faster and 2.6x slower,
# 68 of 60 tokens 2.2x and 1.7x faster; the corpus's batches lay out about 1.2x their rows.
# Such passes go to the grouped calls.
MAX_LAYOUT_OVER_ROWS = 2
MAX_LAYOUT_WITHOUT_CHECK = 2048


class AmxAttention:
    """`(q, k, v, seqs, scale)` -> the attention of `(total_tokens, heads, dim)` bfloat16 rows
    within each sequence, or None where the call does not fit (see the module's docstring)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        lib.vp_attention_bf16.restype = ctypes.c_int
        lib.vp_attention_bf16.argtypes = [
            ctypes.c_void_p,  # q
            ctypes.c_void_p,  # k
            ctypes.c_void_p,  # v
            ctypes.c_void_p,  # stride[3]
            ctypes.c_void_p,  # cu
            ctypes.c_int64,  # seqs
            ctypes.c_int64,  # heads
            ctypes.c_int64,  # dim
            ctypes.c_float,  # scale
            ctypes.c_void_p,  # bias (float32) or NULL
            ctypes.c_int64,  # span
            ctypes.c_int,  # split
            ctypes.c_void_p,  # out
            ctypes.c_int,  # threads
        ]
        # The last pass's layout (`_layout`), kept with the pass's sequences it is for.
        self._last: tuple[PackedSequences, tuple[torch.Tensor, int, int] | None] | None = None

    def _layout(self, seqs: PackedSequences) -> tuple[torch.Tensor, int, int] | None:
        """The real sequences' bounds (int32), count and longest length, or None for a pass of
        many very short texts (`MAX_LAYOUT_OVER_ROWS`); the same for every layer of a pass, so
        worked out on its first."""
        if self._last is not None and self._last[0] is seqs:
            return self._last[1]
        # The filler rows of a padded pass are a sequence of their own, last: zeros.
        count = seqs.size - (1 if seqs.filler else 0)
        cu = seqs.cu_seqlens[: count + 1].to(torch.int32)
        laid_out = int(((cu[1:] - cu[:-1] + 31) // 32).sum()) * 32
        rows = seqs.total - seqs.filler
        fits = laid_out <= max(MAX_LAYOUT_WITHOUT_CHECK, MAX_LAYOUT_OVER_ROWS * rows)
        layout = (cu, count, max(seqs.lengths[:count], default=0)) if fits else None
        self._last = (seqs, layout)
        return layout

    @staticmethod
    def fits(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: PackedSequences) -> bool:
        dim = q.shape[-1]
        return (
            seqs.key_lengths is None
            and q.shape == k.shape == v.shape
            and dim in HEAD_DIMS
            and all(
                t.dtype == torch.bfloat16
                and t.device.type == "cpu"
                and t.stride(2) == 1
                and t.stride(1) == dim
                for t in (q, k, v)
            )
        )

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        seqs: PackedSequences,
        scale: float | None = None,
        bias: ScoreBias | None = None,
    ) -> torch.Tensor | None:
        if not self.fits(q, k, v, seqs):
            return None
        layout = self._layout(seqs)
        if layout is None:
            return None
        cu, count, span = layout
        total, heads, dim = q.shape
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        if seqs.filler:
            out[total - seqs.filler :] = 0
        # MPNet's bias depends on j - i only: each sequence reads the top-left corner of the
        # longest one's, in float32 (rounded to bfloat16 it cost mpnet's sensitive text).
        table = None if bias is None or not span else bias(span, torch.float32).contiguous()
        strides = (ctypes.c_int64 * 3)(q.stride(0), k.stride(0), v.stride(0))
        with torch.profiler.record_function("vp_attention"):
            failed = self.lib.vp_attention_bf16(
                q.data_ptr(),
                k.data_ptr(),
                v.data_ptr(),
                strides,
                cu.data_ptr(),
                count,
                heads,
                dim,
                1.0 / math.sqrt(dim) if scale is None else scale,
                None if table is None else table.data_ptr(),
                span,
                # With a bias (MPNet), P as two bfloat16 parts, see the module's docstring.
                int(table is not None),
                out.data_ptr(),
                torch.get_num_threads(),
            )
        return None if failed else out


class AddNorm:
    """`norm(a + b)` over `a`'s rows for a bfloat16 LayerNorm with weight and bias, or None where
    the call does not fit (see the module's docstring)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        lib.vp_add_norm_bf16.restype = None
        lib.vp_add_norm_bf16.argtypes = [
            ctypes.c_void_p,  # a
            ctypes.c_void_p,  # b
            ctypes.c_int64,  # rows
            ctypes.c_int64,  # n
            ctypes.c_void_p,  # weight (float32)
            ctypes.c_void_p,  # bias (float32)
            ctypes.c_float,  # eps
            ctypes.c_void_p,  # out
            ctypes.c_int,  # threads
        ]
        # Each LayerNorm's weight and bias in float32, made on its first call.
        self.widened: weakref.WeakKeyDictionary[nn.Module, tuple[torch.Tensor, torch.Tensor]] = (
            weakref.WeakKeyDictionary()
        )

    def __call__(self, a: torch.Tensor, b: torch.Tensor, norm: nn.Module) -> torch.Tensor | None:
        if not (
            isinstance(norm, nn.LayerNorm)
            and norm.weight is not None
            and norm.bias is not None
            and a.dim() == 2
            and a.shape == b.shape
            and norm.normalized_shape == (a.shape[1],)
            and a.dtype == b.dtype == torch.bfloat16
            and a.device.type == b.device.type == "cpu"
            and a.is_contiguous()
            and b.is_contiguous()
        ):
            return None
        params = self.widened.get(norm)
        if params is None:
            params = (norm.weight.detach().float(), norm.bias.detach().float())
            self.widened[norm] = params
        weight, bias = params
        with torch.profiler.record_function("vp_add_norm"):
            self.lib.vp_add_norm_bf16(
                a.data_ptr(),
                b.data_ptr(),
                a.shape[0],
                a.shape[1],
                weight.data_ptr(),
                bias.data_ptr(),
                norm.eps,
                a.data_ptr(),
                torch.get_num_threads(),
            )
        return a


def bf16_kernels(dtype: torch.dtype, cache_dir: Path) -> CpuKernels:
    """The kernels for a bfloat16 model's CPU passes: none for another dtype, or where the kernel
    does not build (no AVX-512, no compiler); attention only where the CPU has AMX."""
    if dtype != torch.bfloat16:
        return NONE
    lib = load_library(cache_dir)
    if lib is None:
        return NONE
    attention = AmxAttention(lib) if amx_ready(lib) else None
    log.info(
        "bfloat16 passes: the residual adds and LayerNorms on the compiled kernel, attention %s",
        "on AMX's tiles where it fits" if attention else "on torch's (this CPU has no AMX)",
    )
    return CpuKernels(attention=attention, add_norm=AddNorm(lib))
