"""bfloat16 attention on AMX's tiles (`short_kernel.c`'s `vp_attention_bf16`), where the CPU has
AMX: the CPU passes of a bfloat16 model take it for every attention call it fits (see
`attention.kernel_attention`), in place of grouped `scaled_dot_product_attention` calls.

A bfloat16 pass on AMX spends more of its time outside the GEMMs than in them: with ATen's
flash kernel, attention took 35-40% of all-MiniLM-L6-v2's pass. The kernel takes every
sequence of a pass in one call (no length groups, no gathers, no padding to a common length):
it lays each sequence's keys and values out as the tiles read them (K transposed into pairs of
dimensions, V's rows in pairs), reading the rows whole, then hands the (sequence, head) pairs
to the threads, each scoring 16 queries against 32 keys a step on the tiles, its softmax over
the whole row in float32 (the exponentials rounded to bfloat16 for P V, as ATen's flash kernel
rounds them). On the AMX Xeon, over the corpus's 600 texts in batches of 32 (12 heads of 32):
53-58 ms against the grouped calls' 105-128; by length (equal-length batches, 12 heads of
32 / 64): 1.2-1.6x from 16 to 1,000 tokens, 2.3-2.8x for one short text, one case level
(33 tokens, heads of 64: 0.95x).

It fits attention without a score bias, a window, a causal mask or held-out keys, with as many
key heads as query heads of 32 or 64 dimensions: BERT's, RoBERTa's, XLM-R's, DistilBERT's.
"""

from __future__ import annotations

import ctypes
import math
from pathlib import Path

import torch

from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.torch.short_kernel import amx_ready, load_library

HEAD_DIMS = (32, 64)


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
            ctypes.c_void_p,  # out
            ctypes.c_int,  # threads
        ]

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
    ) -> torch.Tensor | None:
        if not self.fits(q, k, v, seqs):
            return None
        total, heads, dim = q.shape
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        # The filler rows of a padded pass are a sequence of their own, last: zeros.
        count = seqs.size - (1 if seqs.filler else 0)
        real = total - seqs.filler
        if seqs.filler:
            out[real:] = 0
        cu = seqs.cu_seqlens[: count + 1].to(torch.int32)
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
                out.data_ptr(),
                torch.get_num_threads(),
            )
        return None if failed else out


def amx_attention(dtype: torch.dtype, cache_dir: Path) -> AmxAttention | None:
    """The kernel for a bfloat16 model's CPU passes, or None where the CPU has no AMX (or the
    kernel does not build)."""
    if dtype != torch.bfloat16:
        return None
    lib = load_library(cache_dir)
    if lib is None or not amx_ready(lib):
        return None
    return AmxAttention(lib)
