"""Compiled ops that a backend's CPU passes call in place of torch's where a call fits them
(`f32_kernels.py`, `bf16_kernels.py`): chosen once at start-up, and set for each pass on its
thread, as `layers.onednn_linears` sets the linears' path."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

from vectorpress.backends.common.sequences import PackedSequences

if TYPE_CHECKING:
    # attention.py asks this module for its kernel.
    from vectorpress.backends.torch.attention import ScoreBias


class AttentionKernel(Protocol):
    """Attention within each sequence of `(total_tokens, heads, dim)` rows, with an additive
    score bias per length (`attention.ScoreBias`) or none, or None where the call does not fit
    the kernel (the caller then runs its own)."""

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        seqs: PackedSequences,
        scale: float | None = None,
        bias: ScoreBias | None = None,
    ) -> torch.Tensor | None: ...


class AddNormKernel(Protocol):
    """`norm(a + b)`, written over `a`, or None where the call does not fit the kernel."""

    def __call__(
        self, a: torch.Tensor, b: torch.Tensor, norm: nn.Module
    ) -> torch.Tensor | None: ...


@dataclass(frozen=True)
class CpuKernels:
    attention: AttentionKernel | None = None
    add_norm: AddNormKernel | None = None


NONE = CpuKernels()


class _Current(threading.local):
    kernels: CpuKernels = NONE


_current = _Current()


def current() -> CpuKernels:
    """The kernels the pass running on this thread may call."""
    return _current.kernels


@contextmanager
def cpu_kernels(kernels: CpuKernels) -> Iterator[None]:
    """Calls in this block, on this thread, go to `kernels` first, where they fit."""
    before = _current.kernels
    _current.kernels = kernels
    try:
        yield
    finally:
        _current.kernels = before


def add_norm(a: torch.Tensor, b: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """`norm(a + b)`, a post-LayerNorm layer's residual step; `a` (a linear's fresh output) is
    overwritten."""
    kernel = _current.kernels.add_norm
    if kernel is not None:
        out = kernel(a, b, norm)
        if out is not None:
            return out
    normed: torch.Tensor = norm(a.add_(b))
    return normed
