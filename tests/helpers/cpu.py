"""Skips for tests of a CPU fast path where this machine (or VECTORPRESS_PORTABLE_CPU) lacks it:
the portable path those machines run instead is tested on its own (test_portable.py)."""

from __future__ import annotations

import pytest
import torch

from vectorpress.backends.torch import short_kernel
from vectorpress.backends.torch.int8 import int8_missing
from vectorpress.backends.torch.layers import onednn_supported
from vectorpress.cpus import cpu_flags

needs_onednn = pytest.mark.skipif(
    not onednn_supported(torch.float32),
    reason="tests the oneDNN linear path: this CPU or torch build has no oneDNN packed linear "
    "(or VECTORPRESS_PORTABLE_CPU is set)",
)
needs_fbgemm = pytest.mark.skipif(
    int8_missing() is not None,
    reason=f"tests --dtype int8, which runs on fbgemm: {int8_missing()}",
)


def why_no_kernel() -> str | None:
    """Why the compiled kernel cannot build here, or None."""
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        return "the kernel needs AVX-512; this CPU has none"
    if short_kernel._compiler() is None:
        return "no C compiler here"
    return None


# The compiled kernel (backends/torch/short_kernel.c) and its AMX parts.
needs_kernel = pytest.mark.skipif(why_no_kernel() is not None, reason=str(why_no_kernel()))
needs_bf16 = pytest.mark.skipif(
    not onednn_supported(torch.bfloat16), reason="this CPU has no native bfloat16 linear"
)
needs_amx = pytest.mark.skipif("amx_bf16" not in cpu_flags(), reason="this CPU has no AMX")
