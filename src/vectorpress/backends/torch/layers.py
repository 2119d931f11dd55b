"""Small building blocks shared by the model files."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from vectorpress.backends.common.activations import Activation, activation

if TYPE_CHECKING:
    from torch import nn

    from vectorpress.backends.torch.int8 import Int8Weights

log = logging.getLogger(__name__)

# In-place forms, for outputs no one else holds (a GEMM's fresh result): a 4,096 x 1,536 GELU
# ran 1.4x faster in place (no new buffer to fault in).
_IN_PLACE: dict[str, Activation] = {
    "gelu": lambda x: torch.ops.aten.gelu_(x),
    "gelu_new": lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
    "gelu_fast": lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
    "relu": torch.relu_,
    "silu": lambda x: F.silu(x, inplace=True),
    "swish": lambda x: F.silu(x, inplace=True),
    "tanh": torch.tanh_,
}


# oneDNN's post-op for each activation, as (attr, algorithm). An activation missing here runs
# after oneDNN's GEMM, as its own op.
_ONEDNN_POSTOPS: dict[str, tuple[str, str]] = {
    "gelu": ("gelu", "none"),
    "gelu_new": ("gelu", "tanh"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "gelu_fast": ("gelu", "tanh"),
    "relu": ("relu", ""),
    "silu": ("swish", ""),
    "swish": ("swish", ""),
    "tanh": ("tanh", ""),
}

# Activations that run after oneDNN's GEMM in bfloat16 rather than as its post-op. Fused, the
# erf GELU runs no faster (its erf is the cost either way) and, op by op, is rounded once
# instead of twice; yet with it all-mpnet-base-v2 fell to cosine 0.9972 to float32 on one text
# of the benchmark corpus ("If encoding or errors is specified, then the object"), where unfused
# its lowest over the 300 texts is 0.9992. That text lands near 0.997 under every more exact
# rounding tried (a float32 residual stream, the residual added as a post-op): the unfused form
# is kept because it is the one that holds the corpus bound (docs/performance.md). With the
# relative position bias kept in float32 (`FusedModel.float32_parts`), on a Zen 5 unfused gives a
# lowest of 0.99989 over the corpus' 300 texts, fused 0.99918 (another text).
# float32 keeps the fused post-op.
_UNFUSED_IN_BF16 = frozenset({"gelu"})


def portable_cpu() -> bool:
    """Whether `VECTORPRESS_PORTABLE_CPU=1` asks for the path a CPU without oneDNN, AVX-512 or
    fbgemm gets (F.linear everywhere, no int8) on any CPU.

    Read from the environment here rather than from the settings: like torch's own
    ATEN_CPU_CAPABILITY it stands in for the hardware, so that the parity tests can run the
    portable path on machines that have every fast kernel (tests/fast_paths/test_portable.py).
    """
    return os.environ.get("VECTORPRESS_PORTABLE_CPU", "") not in ("", "0")


def onednn_supported(dtype: torch.dtype) -> bool:
    """Whether this CPU build can run oneDNN's packed linear in `dtype` at native speed."""
    if portable_cpu():
        return False
    if not torch.backends.mkldnn.is_available() or not hasattr(
        torch.ops.mkldnn, "_linear_pointwise"
    ):
        return False
    if dtype == torch.float32:
        return True
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


@functools.cache
def _warn_slow_bf16() -> None:
    log.warning(
        "this CPU has no native bfloat16 GEMM (AVX512-BF16 or AMX): --dtype bfloat16 runs "
        "emulated and slower than float32"
    )


class _Kernel(threading.local):
    onednn = True
    observe: Callable[[FusedLinear, torch.Tensor], None] | None = None


_kernel = _Kernel()


@contextmanager
def onednn_linears(enabled: bool) -> Iterator[None]:
    """Whether FusedLinear layers run their packed oneDNN weights in this block, on this
    thread; with False they take F.linear (see passes.plan_passes for why both). Int8 layers
    take oneDNN's int8 GEMM or fbgemm's alike, of those they hold (int8.py)."""
    before = _kernel.onednn
    _kernel.onednn = enabled
    try:
        yield
    finally:
        _kernel.onednn = before


@contextmanager
def observe_linears(observe: Callable[[FusedLinear, torch.Tensor], None]) -> Iterator[None]:
    """Call `observe(layer, input)` before every FusedLinear runs in this block, on this thread
    (int8 calibration)."""
    before = _kernel.observe
    _kernel.observe = observe
    try:
        yield
    finally:
        _kernel.observe = before


class FusedLinear:
    """`act(x @ weight.T + bias)` on the fastest CPU kernel this build has.

    On the CPU, oneDNN with the weight reordered once into its blocked layout, and the
    activation fused into the GEMM, can run the linear layers of an encoder well above MKL's sgemm
    behind `F.linear` on AMD CPUs where MKL picks generic kernels; on an AVX2-only EPYC it won
    only on short passes and on a Zen 4 with AVX-512 the two ran level, so which one runs is
    planned per model and pass size (`passes.plan_passes`, `onednn_linears`).
    `_linear_pointwise` is a private op, so anything unexpected (no oneDNN, an op that changed,
    another device, a dtype the CPU lacks) falls back to `F.linear` plus the activation, and the
    packed path is checked against that fallback once when it is built.

    Not an nn.Module on purpose: it holds a derived copy of weights that the state dict owns,
    so it is built after loading and after the final `.to(device, dtype)`.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        act: str | None = None,
        *,
        fast: bool = True,
    ) -> None:
        self.weight = weight.detach()
        self.bias = bias.detach() if bias is not None else None
        self.act_name = act
        self.act: Activation | None = activation(act) if act not in (None, "identity") else None
        self.act_: Activation | None = _IN_PLACE.get(str(act), self.act) if self.act else None
        self.packed: torch.Tensor | None = None
        # Set by int8.quantize_linears; runs instead of both float kernels.
        self.int8: Int8Weights | None = None
        self.attr, self.algorithm = "none", ""
        plain = act in (None, "identity")
        postop = None if plain else _ONEDNN_POSTOPS.get(str(act))
        if self.weight.dtype == torch.bfloat16 and act in _UNFUSED_IN_BF16:
            postop = None
        # An activation without a post-op runs after oneDNN's GEMM.
        self.act_after = not plain and postop is None
        on_cpu = self.weight.device.type == "cpu"
        if fast and on_cpu and onednn_supported(self.weight.dtype):
            self._pack(postop or ("none", ""))
        elif fast and on_cpu and self.weight.dtype == torch.bfloat16:
            _warn_slow_bf16()

    @classmethod
    def of(
        cls, linear: torch.nn.Linear, act: str | None = None, *, fast: bool = True
    ) -> FusedLinear:
        return cls(linear.weight, linear.bias, act, fast=fast)

    @property
    def onednn(self) -> bool:
        return self.packed is not None

    def _pack(self, postop: tuple[str, str]) -> None:
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, None)
            self.packed, (self.attr, self.algorithm) = packed, postop
            probe = torch.randn(
                7,
                self.weight.shape[1],
                dtype=self.weight.dtype,
                generator=torch.Generator().manual_seed(0),
            )
            got, want = self(probe).float(), self._fallback(probe).float()
        except (RuntimeError, TypeError, AttributeError):
            self.packed = None
            return
        tol = 1e-3 if self.weight.dtype == torch.float32 else 5e-2
        if not torch.allclose(got, want, rtol=tol, atol=tol * (1 + float(want.abs().max()))):
            self.packed = None

    def release_float(self) -> None:
        """Drop the float weights once `int8` holds the layer (nothing else reads them)."""
        assert self.int8 is not None
        self.weight = self.weight.new_empty(0)
        self.packed = None

    def _fallback(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        return self.act_(y) if self.act_ is not None else y

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if _kernel.observe is not None:
            _kernel.observe(self, x)
        if self.int8 is not None:
            # GELU in the int8 GEMM's finish, as the int8 kernel applies it.
            gelu = self.act_name == "gelu"
            y = self.int8(x, self.bias, onednn=_kernel.onednn, gelu=gelu)
            return self.act_(y) if self.act_ is not None and not gelu else y
        if self.packed is None or not _kernel.onednn:
            return self._fallback(x)
        y = torch.ops.mkldnn._linear_pointwise(
            x, self.packed, self.bias, self.attr, [], self.algorithm
        )
        if self.act_after:
            assert self.act_ is not None
            return self.act_(y)
        return y


def fused_linears(module: nn.Module) -> list[FusedLinear]:
    """Every FusedLinear a module tree holds: model files keep them in plain attributes, alone,
    in tuples or in the dataclasses of `blocks`."""
    found: dict[int, FusedLinear] = {}

    def visit(value: object) -> None:
        if isinstance(value, FusedLinear):
            found.setdefault(id(value), value)
        elif isinstance(value, tuple | list):
            for item in value:
                visit(item)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for field in dataclasses.fields(value):
                visit(getattr(value, field.name))

    for sub in module.modules():
        for value in vars(sub).values():
            visit(value)
    return list(found.values())
