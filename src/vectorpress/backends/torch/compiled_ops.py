"""What the compiled ops of float32 (`f32_kernels.py`) and bfloat16 (`bf16_kernels.py`) passes
share, calls into the short-pass kernel's library (`short_kernel.c`).

Attention over a whole packed pass in one call (`KernelAttention`): each kernel lays the
sequences' queries, keys and values out for its blocks (the keys padded to whole blocks) and
hands the (sequence, head) pairs to the threads as they come free: no length groups, no gathers,
no padding to a common length. It fits attention without a window, a causal mask or held-out
keys, with as many key heads as query heads, contiguous per head: BERT's, RoBERTa's, XLM-R's,
DistilBERT's, and MPNet's with its relative position bias (in float32, each sequence reading the
longest one's top-left corner).

The residual add and LayerNorm of a post-LayerNorm layer as one op (`AddNorm`).
"""

from __future__ import annotations

import ctypes
import math
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.torch.attention import ScoreBias

# A pass of many very short texts lays out several times its rows (each sequence in whole key
# blocks), and pays a task per text and head; where its layout is more than a kernel's
# `max_layout_over_rows` times its rows it goes to the grouped calls. The corpus's batches lay
# out about 1.2x their rows.
MAX_LAYOUT_WITHOUT_CHECK = 2048


@dataclass(frozen=True)
class Layout:
    """A pass's real sequences as the kernel takes them."""

    cu: torch.Tensor
    """Their bounds, int32 (the filler rows left out)."""
    count: int
    longest: int


class _LastLayout(threading.local):
    value: tuple[PackedSequences, Layout | None] | None = None


class KernelAttention:
    """`(q, k, v, seqs, scale, bias)` -> the attention of `(total_tokens, heads, dim)` rows
    within each sequence, or None where the call does not fit (see the module's docstring).
    A kernel's class names its entry in the library and what it takes."""

    dtype: torch.dtype
    head_dims: tuple[int, ...]
    key_block: int
    max_layout_over_rows: float
    function: str
    options: tuple[type[ctypes._SimpleCData[Any]], ...] = ()
    """The kernel's own arguments, after the bias's span (`_options` gives them)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.run = getattr(lib, self.function)
        self.run.restype = ctypes.c_int
        self.run.argtypes = [
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
            *self.options,
            ctypes.c_void_p,  # out
            ctypes.c_int,  # threads
        ]
        # Each thread's last pass's layout (`_layout`), kept with the pass's sequences it is
        # for: passes run side by side on the scheduler's runners (`core/scheduler.py`).
        self._last = _LastLayout()

    def _options(self, table: torch.Tensor | None) -> tuple[int, ...]:
        """The values of `options` for a call with this bias table (or none)."""
        return ()

    def _layout(self, seqs: PackedSequences) -> Layout | None:
        """The pass's real sequences, or None for a pass of many very short texts
        (`max_layout_over_rows`); the same for every layer of a pass, so worked out on its
        first."""
        last = self._last.value
        if last is not None and last[0] is seqs:
            return last[1]
        # The filler rows of a padded pass are a sequence of their own, last: zeros.
        count = seqs.size - (1 if seqs.filler else 0)
        cu = seqs.cu_seqlens[: count + 1].to(torch.int32)
        block = self.key_block
        laid_out = int(((cu[1:] - cu[:-1] + block - 1) // block).sum()) * block
        rows = seqs.total - seqs.filler
        fits = laid_out <= max(MAX_LAYOUT_WITHOUT_CHECK, self.max_layout_over_rows * rows)
        layout = Layout(cu, count, max(seqs.lengths[:count], default=0)) if fits else None
        self._last.value = (seqs, layout)
        return layout

    def fits(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: PackedSequences
    ) -> bool:
        dim = q.shape[-1]
        return (
            seqs.key_lengths is None
            and q.shape == k.shape == v.shape
            and dim in self.head_dims
            and all(
                t.dtype == self.dtype
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
        total, dim = q.shape[0], q.shape[2]
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        if seqs.filler:
            out[total - seqs.filler :] = 0
        # MPNet's bias depends on j - i only: each sequence reads the top-left corner of the
        # longest one's, in float32.
        span = layout.longest
        table = None if bias is None or not span else bias(span, torch.float32).contiguous()
        with torch.profiler.record_function("vp_attention"):
            failed = self.run(
                q.data_ptr(),
                k.data_ptr(),
                v.data_ptr(),
                (ctypes.c_int64 * 3)(q.stride(0), k.stride(0), v.stride(0)),
                layout.cu.data_ptr(),
                layout.count,
                q.shape[1],
                dim,
                1.0 / math.sqrt(dim) if scale is None else scale,
                None if table is None else table.data_ptr(),
                span,
                *self._options(table),
                out.data_ptr(),
                torch.get_num_threads(),
            )
        return None if failed else out


class AddNorm:
    """`norm(a + b)` over `a`'s rows, written over `a`, for a LayerNorm with weight and bias in
    `dtype` (float32 or bfloat16), or None where the call does not fit: a post-LayerNorm layer's
    residual step in one pass over the rows where torch's add and LayerNorm take three."""

    def __init__(self, lib: ctypes.CDLL, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.run = lib.vp_add_norm_bf16 if dtype == torch.bfloat16 else lib.vp_add_norm_f32
        self.run.restype = None
        self.run.argtypes = [
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
            and a.dtype == b.dtype == self.dtype
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
            self.run(
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
