"""Compiled ops for a float32 model's longer CPU passes (`cpu_kernels.py`), from the short-pass
kernel's library (`short_kernel.c`), on any AVX-512 CPU: attention, and the post-LayerNorm
layers' residual add and LayerNorm as one op (`compiled_ops.py`).

ATen's flash kernel ran all-MiniLM-L6-v2's float32 attention at about 28% of the GEMM ceiling
(the corpus's 600 texts in batches of 32, one layer's grouped calls: 150-160 ms, 98-107
GFLOP/s, the AMX Xeon), and it took 16-17% of the pass. The kernel (`compiled_ops.py`) hands
the (sequence, head) pairs to the threads, and each lays its head out in its own scratch (Q and
V rows, K transposed in blocks of 16 keys), then scores 4 queries against 64 keys a step in
registers (each score one FMA chain over the head's dimensions), takes each query's softmax over
its whole row in float32 (base-2 exponentials to about 2e-7, shifted by the row's largest; the
sum's inverse scaling the result) and multiplies P by V 8 queries by 32 columns a step. The same
layer: 88-93 ms (12 heads of 32), 161-175 against 250-258 ms (12 heads of 64); the whole pass
1.06-1.13x (alternated rounds, two sessions: 11,500-11,940 tokens/s against 10,580-10,720), its
vectors within 1.4e-6 of torch's. By length (equal-length batches, 12 heads, either head size):
1.3-2.6x from 33 tokens, 1.07-1.12x at 16, at 400 texts of 10 tokens 1.9x (heads of 32) and
2.6x (64); 1,300 texts of 3 tokens 0.8x (`max_layout_over_rows` sends those to the grouped
calls). all-mpnet-base-v2 (heads of 64, its attention a smaller share of a 768-wide model's
pass) 1.02x.

The residual step: 839 us against torch's add and LayerNorm's 1,709 on 3,800 rows of 768
(mpnet's), 443 against 471 on 2,940 of 384 (MiniLM's), the values a few float32 steps apart at
most (LayerNorm's moments summed in another order).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from vectorpress.backends.torch.compiled_ops import AddNorm, KernelAttention
from vectorpress.backends.torch.cpu_kernels import NONE, CpuKernels
from vectorpress.backends.torch.short_kernel import load_library

log = logging.getLogger(__name__)


class FloatAttention(KernelAttention):
    """float32 attention on the vector units (see the module's docstring)."""

    dtype = torch.float32
    head_dims = (16, 32, 64, 128)
    key_block = 16
    # Its scratch does not grow with the pass (each head laid out by the thread that takes it):
    # 1,000 texts of 4 tokens 1.6x (heads of 32) / 1.1x (64) faster than the grouped calls,
    # 1,300 of 3 1.2x / 1.3x slower (the AMX Xeon).
    max_layout_over_rows = 4
    function = "vp_attention_f32"


def f32_kernels(dtype: torch.dtype, cache_dir: Path) -> CpuKernels:
    """The kernels for a float32 model's CPU passes: none for another dtype, or where the
    kernel does not build (no AVX-512, no compiler)."""
    if dtype != torch.float32:
        return NONE
    lib = load_library(cache_dir)
    if lib is None:
        return NONE
    log.info("float32 passes: attention, the residual adds and LayerNorms on the compiled kernel")
    return CpuKernels(attention=FloatAttention(lib), add_norm=AddNorm(lib, torch.float32))
