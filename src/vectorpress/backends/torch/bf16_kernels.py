"""Compiled ops for a bfloat16 model's CPU passes (`cpu_kernels.py`), from the short-pass
kernel's library (`short_kernel.c`): attention on AMX's tiles where the CPU has AMX, else on
AVX512-BF16's dot products where it has those, else the float32 kernel's on the rows widened to
float32, and the post-LayerNorm layers' residual add and LayerNorm as one op on any AVX-512 CPU.

Without AMX (a Zen 5 with AVX512-BF16, 2026-12-05), ATen's bfloat16 attention took 42% of
all-MiniLM-L6-v2's bfloat16 pass, where the GEMMs took 49%. The float32 kernel (`f32_kernels.py`)
widens each head's bfloat16 rows as it lays them out (it copies them anyway), works in float32
(P too) and rounds its output to bfloat16 (`WidenedAttention`): the pass in-process (600 corpus
texts in batches of 32, three alternated rounds) 28,685-29,467 tokens/s against 19,537-20,282,
lowest cosine to float32 0.99991 against 0.99988; all-mpnet-base-v2 (150 texts, its bias and
attention in float32 either way) 4,081-4,241 against 3,311-3,378, 0.99991 both.

Where the CPU has AVX512-BF16 (the Zen 5; Zen 4, Cooper Lake), the same layout and blocks run on
its dot products (`DotAttention`, `vp_attention_bf16_dot`): vdpbf16ps multiplies two pairs of
bfloat16 values a lane into a float32 sum, each product exact, so Q K^T takes the bfloat16 rows
as they are at twice the FMAs' rate; P is rounded to bfloat16 for P V (as ATen's flash kernel
and the AMX kernel round it; in two parts with MPNet's bias, as on AMX). One layer's call over
the corpus's 600 texts in batches of 32 (the Zen 5, 12 heads): 36 against 50 ms for heads of 32,
60 against 91 for 64; by length (equal-length texts, heads of 32 / 64) 2,000 of 1 token 1.3x /
1.4x, 500 of 8 1.2x / 1.1x, 68 of 60 1.4x / 1.3x, 8 of 400 1.6x / 1.75x faster than the widened
kernel. MiniLM's pass in-process (600 texts, three alternated rounds) 32,521-33,515 tokens/s
against 29,307-30,529, again 33,945-34,176 against 31,970-32,549, lowest cosine to float32 over
the 1,200 corpus texts 0.99989 against 0.99991; all-mpnet-base-v2 (150 texts) 4,639-4,712 against
4,560-4,612, lowest over its 300 0.99967 against 0.99991 (one 384-token text whose cosine moves
with any rounding-level change; with P in one part it read 0.99994, docs/performance.md).

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

It fits the calls `compiled_ops.py` says, with heads of 32 or 64 dimensions. MPNet's relative
position bias stays float32, added to the float32 scores (torch's bfloat16
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
from pathlib import Path

import torch

from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.torch.attention import ScoreBias
from vectorpress.backends.torch.compiled_ops import AddNorm, KernelAttention
from vectorpress.backends.torch.cpu_kernels import NONE, AttentionKernel, CpuKernels
from vectorpress.backends.torch.short_kernel import amx_ready, load_library
from vectorpress.cpus import cpu_flags

log = logging.getLogger(__name__)


class AmxAttention(KernelAttention):
    """bfloat16 attention on AMX's tiles (see the module's docstring)."""

    dtype = torch.bfloat16
    head_dims = (32, 64)
    key_block = 32
    # Measured on the AMX Xeon (12 heads of 32 / 64 against the grouped calls): 1,300 texts of 3
    # tokens 3.2x / 4.8x slower, 400 of 10 1.5x / 1.2x faster, 500 of 8 1.4x faster / 2.6x
    # slower (a pass's layout over 64 MiB is the call's own fresh memory, its pages faulted in:
    # `scratch` in short_kernel.c), 68 of 60 2.2x / 2.1x faster.
    max_layout_over_rows = 2
    function = "vp_attention_bf16"
    options = (ctypes.c_int,)  # split

    def _options(self, table: torch.Tensor | None) -> tuple[int, ...]:
        # With a bias (MPNet), P as two bfloat16 parts, see the module's docstring.
        return (int(table is not None),)


class WidenedAttention(KernelAttention):
    """bfloat16 attention on a CPU without AMX: the float32 kernel (`f32_kernels.py`), its rows
    widened to float32 as each head is laid out, its output rounded to bfloat16."""

    dtype = torch.bfloat16
    head_dims = (16, 32, 64, 128)
    key_block = 16
    # Every pass (a text of one token lays out 16 rows): against ATen's bfloat16 calls on the
    # Zen 5 (12 heads of 32 / 64), 2,000 texts of 1 token 1.7x / 1.2x faster, 1,300 of 3
    # 4.7x / 3.0x, 68 of 60 3.9x / 3.2x, 8 of 400 3.2x / 2.8x.
    max_layout_over_rows = 16
    function = "vp_attention_bf16_f32"


class DotAttention(KernelAttention):
    """bfloat16 attention on AVX512-BF16's dot products, on a CPU that has them but no AMX
    (see the module's docstring)."""

    dtype = torch.bfloat16
    head_dims = (16, 32, 64, 128)
    key_block = 16
    # Every pass, as the widened kernel's (which it outruns at every length measured).
    max_layout_over_rows = 16
    function = "vp_attention_bf16_dot"
    options = (ctypes.c_int,)  # split

    def _options(self, table: torch.Tensor | None) -> tuple[int, ...]:
        # With a bias (MPNet), P as two bfloat16 parts, as AMX's.
        return (int(table is not None),)


class RoundedAttention(KernelAttention):
    """An int8 model's attention on AVX512-BF16's dot products: its float32 rows rounded to
    bfloat16 as they are laid out, the output float32 (`int8.py` says why); a call with a score
    bias (MPNet's) goes to `with_bias`, on float32 rows."""

    dtype = torch.float32
    head_dims = (16, 32, 64, 128)
    key_block = 16
    # As the float32 kernel's (`f32_kernels.FloatAttention`): a pass of many very short texts
    # goes to ATen's float32 calls.
    max_layout_over_rows = 4
    function = "vp_attention_f32_dot"
    options = (ctypes.c_int,)  # split: never, calls with a bias go elsewhere

    def __init__(self, lib: ctypes.CDLL, with_bias: AttentionKernel | None) -> None:
        super().__init__(lib)
        self.with_bias = with_bias

    def _options(self, table: torch.Tensor | None) -> tuple[int, ...]:
        return (0,)

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        seqs: PackedSequences,
        scale: float | None = None,
        bias: ScoreBias | None = None,
    ) -> torch.Tensor | None:
        if bias is not None:
            # all-mpnet-base-v2's int8 vectors fell to cosine 0.98886 to float32 on the corpus
            # with its rows rounded (0.99129 on float32 rows; the bound is 0.99).
            return None if self.with_bias is None else self.with_bias(q, k, v, seqs, scale, bias)
        return super().__call__(q, k, v, seqs, scale)


def rounded_attention(
    cache_dir: Path, with_bias: AttentionKernel | None
) -> RoundedAttention | None:
    """`RoundedAttention` where the CPU has AVX512-BF16 and the kernel builds, else None."""
    lib = load_library(cache_dir)
    if lib is None or not _has_dot_kernel(lib):
        return None
    return RoundedAttention(lib, with_bias)


def _has_dot_kernel(lib: ctypes.CDLL) -> bool:
    """Whether this CPU has AVX512-BF16 and the library its kernel (a compiler from before
    AVX512-BF16 builds the rest without it)."""
    return (
        "avx512_bf16" in cpu_flags()
        and hasattr(lib, DotAttention.function)
        and hasattr(lib, RoundedAttention.function)
    )


def bf16_kernels(dtype: torch.dtype, cache_dir: Path) -> CpuKernels:
    """The kernels for a bfloat16 model's CPU passes: none for another dtype, or where the kernel
    does not build (no AVX-512, no compiler); attention on AMX's tiles where the CPU has AMX,
    else on AVX512-BF16's dot products where it has those, else in float32 on the vector
    units."""
    if dtype != torch.bfloat16:
        return NONE
    lib = load_library(cache_dir)
    if lib is None:
        return NONE
    attention: KernelAttention
    if amx_ready(lib):
        attention, where = AmxAttention(lib), "on AMX's tiles where it fits"
    elif _has_dot_kernel(lib):
        attention, where = DotAttention(lib), "on AVX512-BF16's dot products (no AMX)"
    else:
        attention, where = WidenedAttention(lib), "in float32 on the vector units (no AVX512-BF16)"
    log.info(
        "bfloat16 passes: the residual adds and LayerNorms on the compiled kernel, attention %s",
        where,
    )
    return CpuKernels(attention=attention, add_norm=AddNorm(lib, torch.bfloat16))
