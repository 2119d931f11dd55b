"""`--dtype int8` on the CPU: every FusedLinear as an 8-bit GEMM on fbgemm.

The recipe, chosen by the accuracy of all-MiniLM-L6-v2 on the benchmark corpus (cosine to
float32, 200 texts): one scale per token for activations (one per tensor, as fbgemm's dynamic
linear takes it, gave 0.982 at best: a long text's outliers coarsen every other text of its
pass, and a vector would depend on its batch-mates), one per output channel for weights, and
SmoothQuant's per-channel migration of activation outliers into the weights (alpha 0.5,
calibrated once at start-up on `common/data/calibration.txt`): minimum 0.9957 with it, 0.9904
without, in the probe that chose it; the recipe as shipped keeps >= 0.9927 on all 1,200 texts of the
default corpus with 7-bit weights (tests/fast_paths/test_int8.py). Weights keep 8 bits on CPUs with
VNNI (minimum 0.9959 on those 1,200 texts) and 7 bits elsewhere: on AVX2 without VNNI the kernel
sums pairs of u8 x s8 products in 16 bits with saturation (255 x 127 x 2 overflows; 255 x 63 x
2 does not), and 8-bit weights after smoothing lost more to that than they gained (0.988).

Two GEMMs: fbgemm's, which takes the scaled float32 rows and quantizes them itself, and
oneDNN's, which takes them quantized to u8 (by the compiled kernel as it scales them, or by
torch's ops). Start-up times both on a pass of INT8_PASS_TOKENS (`passes.plan_passes`) and keeps
one for every pass, so that a text's vector does not depend on the size of its pass either (the
two round their float32 outputs differently in the last bit). On a Zen 4 (2 cores), alone on
all-MiniLM-L6-v2's four linear shapes at 2,048 rows: fbgemm's op 15.7 ms, oneDNN's on u8 rows
9.0 (fbgemm's own on u8 rows 9.5: its fused quantization of a float32 input cost about as much
again as its GEMM), bfloat16's 19.3; on 16 rows fbgemm's 140 us against oneDNN's 177. The
model's int8 pass on the 600-text corpus (batches of 32, three alternated rounds) ran
21,128-22,657 tokens/s on oneDNN against 17,736-19,285 on fbgemm and bfloat16's 15,560-16,067.
oneDNN keeps a primitive per input shape, so its passes are padded to a few row counts
(`passes.bucket_rows`). Each GEMM's output is finished in one pass over it (`Finish`: the row's
scale, the bias and, after the FFN's first linear, GELU), by the function the short passes'
kernel finishes its own with (`int8_kernel.py`).

Attention, between the int8 GEMMs, takes float32 rows. Where the CPU has AVX512-BF16 it runs on
the dot products' kernel, the rows rounded to bfloat16 as they are laid out
(`bf16_kernels.RoundedAttention`): on a Zen 5 the float32 kernel's attention was 19% of
all-MiniLM-L6-v2's int8 pass; rounded, the pass ran 36,322-37,055 tokens/s against
33,633-34,558 (three alternated rounds; again 32,349-33,785 against 30,606-32,186), lowest cosine
to float32 over the 1,200 corpus texts 0.99369 against 0.99438 (mean 0.99873 against 0.99875).
all-mpnet-base-v2's attention, with its relative position bias, keeps float32 rows: rounded, its
lowest fell to 0.98886 (0.99129 unrounded), under the 0.99 bound."""

from __future__ import annotations

import ctypes
import dataclasses
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from vectorpress.backends.common.calibration import ALPHA, WEIGHT_LEVELS, row_range, smoothing
from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.torch.layers import (
    FusedLinear,
    fused_linears,
    observe_linears,
    portable_cpu,
)
from vectorpress.errors import StartupError

# Passes of 2,048 tokens: the per-token scaling passes over every activation once more, and at
# 4,096 tokens those no longer stay in the caches (alone, a 4,096-token pass ran 1.2-1.3x
# float32's speed and 1,024 tokens 1.4-1.5x; on the corpus 2,048 did best).
INT8_PASS_TOKENS = 2048
# fbgemm's int8 linear on a float input quantized on a scale and zero point given by the caller
# (its dynamic linear finds them from the input's range: one more pass over it).
_LINEAR = "linear_with_input_q_dq_qweight_dq_output_fp32"


class _Workspace(threading.local):
    """Buffers per thread (one per dtype) that a layer's scaled or quantized input is written
    into: a new tensor of a pass's size each time comes from fresh pages (mmap), and the faults
    cost more than the multiplication that fills it."""

    def __init__(self) -> None:
        self.buffers: dict[torch.dtype, torch.Tensor] = {}

    def take(self, rows: int, cols: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        buffer = self.buffers.get(dtype)
        if buffer is None or buffer.numel() < rows * cols:
            # A plain tensor, even when made under inference_mode: one made there could not be
            # written outside it, and the same layers also run outside (calibration, tests).
            with torch.inference_mode(False):
                buffer = self.buffers[dtype] = torch.empty(rows * cols, dtype=dtype)
        return buffer[: rows * cols].view(rows, cols)


_workspace = _Workspace()


def workspace(rows: int, cols: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """This thread's kept buffer of `dtype` as a `(rows, cols)` tensor (its values whatever the
    last user left): what an int8 pass writes its quantized or scratch rows into."""
    return _workspace.take(rows, cols, dtype)


# Each row of an int8 linear's input times the weights' unsmoothing factor, scaled into
# [-low, 1] by its own scale: `(x, unsmooth, low, body) -> scale`, the rows written to `body`.
ScaleRows = Callable[[torch.Tensor, torch.Tensor, float, torch.Tensor], torch.Tensor]


def scale_rows(
    x: torch.Tensor, unsmooth: torch.Tensor, low: float, body: torch.Tensor
) -> torch.Tensor:
    """`ScaleRows` on torch's ops."""
    torch.mul(x, unsmooth, out=body)  # not in place: x is often the residual too
    # amax and amin: aminmax over rows ran 10x slower than both together.
    reach_below = body.amin(1, keepdim=True).div_(-low)
    scale = torch.maximum(body.amax(1, keepdim=True), reach_below).clamp_min_(1e-12)
    body.div_(scale)
    return scale


# The same rows quantized to u8 as they are written, for oneDNN's GEMM:
# `(x, unsmooth, low, step, zero, q) -> scale`, q = clamp(round(row * step + zero), 0, 255), the
# multiply-add rounded once (fbgemm's quantization of the float32 rows gives the same u8).
QuantizeRows = Callable[[torch.Tensor, torch.Tensor, float, float, int, torch.Tensor], torch.Tensor]


def quantize_rows(
    x: torch.Tensor, unsmooth: torch.Tensor, low: float, step: float, zero: int, q: torch.Tensor
) -> torch.Tensor:
    """`QuantizeRows` on torch's ops (round: to nearest even)."""
    body = torch.empty_like(x)
    scale = scale_rows(x, unsmooth, low, body)
    step = float(np.float32(step))  # the compiled kernel's is a float32
    # In float64 the product is exact, so its sum with `zero` rounds to float32 as a fused
    # multiply-add would.
    fused = body.double().mul_(step).add_(zero).float()
    q.copy_(fused.round_().clamp_(0, 255))
    return scale


def _row_kernel(lib: ctypes.CDLL, name: str, *middle: Any) -> Any:
    """One of the library's int8 row functions: `(x, rows, n, unsmooth, low, *middle, scale,
    threads)`."""
    run = getattr(lib, name)
    run.restype = None
    run.argtypes = [
        ctypes.c_void_p,  # x
        ctypes.c_int64,  # rows
        ctypes.c_int64,  # n
        ctypes.c_void_p,  # unsmooth
        ctypes.c_float,  # low
        *middle,
        ctypes.c_void_p,  # scale
        ctypes.c_int,  # threads
    ]
    return run


def _compiled_takes(x: torch.Tensor) -> bool:
    return x.dtype == torch.float32 and x.is_contiguous() and x.device.type == "cpu"


def _run_rows(
    run: Any, x: torch.Tensor, unsmooth: torch.Tensor, low: float, *middle: Any
) -> torch.Tensor:
    rows, n = x.shape
    scale = torch.empty(rows, 1)
    run(
        x.data_ptr(),
        rows,
        n,
        unsmooth.data_ptr(),
        low,
        *middle,
        scale.data_ptr(),
        torch.get_num_threads(),
    )
    return scale


class CompiledScaleRows:
    """`ScaleRows` in one pass over each row on the compiled kernel's library (`short_kernel.c`),
    the same values as `scale_rows`, whose mul, amin, amax and div took 13% of all-MiniLM-L6-v2's
    int8 pass under torch's profiler on a Zen 5: the pass (600 corpus texts in batches of 32,
    three alternated rounds) 34,082-35,072 tokens/s against 32,803-33,545, its vectors the same."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.run = _row_kernel(lib, "vp_int8_scale_rows", ctypes.c_void_p)  # body

    def __call__(
        self, x: torch.Tensor, unsmooth: torch.Tensor, low: float, body: torch.Tensor
    ) -> torch.Tensor:
        if not _compiled_takes(x):
            return scale_rows(x, unsmooth, low, body)
        return _run_rows(self.run, x, unsmooth, low, body.data_ptr())


class CompiledQuantizeRows:
    """`QuantizeRows` in one pass over each row's values on the compiled kernel's library
    (`short_kernel.c`), the same values as `quantize_rows`."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        # step, zero, q
        self.run = _row_kernel(
            lib, "vp_int8_quantize_rows", ctypes.c_float, ctypes.c_int32, ctypes.c_void_p
        )

    def __call__(
        self,
        x: torch.Tensor,
        unsmooth: torch.Tensor,
        low: float,
        step: float,
        zero: int,
        q: torch.Tensor,
    ) -> torch.Tensor:
        if not _compiled_takes(x):
            return quantize_rows(x, unsmooth, low, step, zero, q)
        return _run_rows(self.run, x, unsmooth, low, step, zero, q.data_ptr())


# An int8 GEMM's float32 output finished in place: `(y, scale, bias, gelu) -> y`, each row times
# its input row's scale, the bias (or None) added, then GELU (erf) where `gelu`.
Finish = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, bool], torch.Tensor]


def finish(
    y: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, gelu: bool
) -> torch.Tensor:
    """`Finish` on torch's ops (`addcmul` rounds the product before the sum, where the compiled
    kernel's fused multiply-add does not; its GELU's erf is torch's: the two differ in the last
    bits)."""
    y = y.mul_(scale) if bias is None else torch.addcmul(bias, y, scale, out=y)
    return torch.ops.aten.gelu_(y) if gelu else y


class CompiledFinish:
    """`Finish` in one pass over the rows on the compiled kernel's library (`short_kernel.c`),
    where torch's addcmul and GELU took two; the same function the int8 kernel's passes finish
    their GEMMs with (`int8_kernel.py`), so that a token's values are the same on either."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.run = lib.vp_int8_finish
        self.run.restype = None
        self.run.argtypes = [
            ctypes.c_void_p,  # y
            ctypes.c_int64,  # rows
            ctypes.c_int64,  # n
            ctypes.c_void_p,  # scale
            ctypes.c_void_p,  # bias, or NULL
            ctypes.c_int,  # gelu
            ctypes.c_int,  # threads
        ]

    def __call__(
        self, y: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, gelu: bool
    ) -> torch.Tensor:
        if not (
            _compiled_takes(y)
            and y.dim() == 2
            and (bias is None or _compiled_takes(bias))
            and scale.is_contiguous()
        ):
            return finish(y, scale, bias, gelu)
        self.run(
            y.data_ptr(),
            y.shape[0],
            y.shape[1],
            scale.data_ptr(),
            None if bias is None else bias.data_ptr(),
            int(gelu),
            torch.get_num_threads(),
        )
        return y


@dataclass(frozen=True)
class RowScaling:
    """How an int8 linear's input rows are scaled, into float32 (fbgemm's GEMM) or to u8
    (oneDNN's), and its output finished."""

    scale: ScaleRows
    quantize: QuantizeRows
    finish: Finish


TORCH_ROWS = RowScaling(scale_rows, quantize_rows, finish)


def compiled_rows(lib: ctypes.CDLL | None) -> RowScaling:
    """The row scaling on the compiled kernel's library where it is loaded, else torch's ops."""
    if lib is None:
        return TORCH_ROWS
    return RowScaling(CompiledScaleRows(lib), CompiledQuantizeRows(lib), CompiledFinish(lib))


def onednn_int8_missing() -> str | None:
    """Why oneDNN's int8 linear cannot run here, or None where it can."""
    if portable_cpu():
        return "VECTORPRESS_PORTABLE_CPU is set"
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN"
    if not all(hasattr(torch.ops.onednn, op) for op in ("qlinear_prepack", "qlinear_pointwise")):
        return "this torch build has no oneDNN int8 linear"
    return None


def int8_ready() -> None:
    """Raise unless this torch build runs fbgemm's int8 linear (x86 CPUs)."""
    engines = torch.backends.quantized.supported_engines
    if portable_cpu():
        raise StartupError(
            "--dtype int8 needs fbgemm's int8 kernels: VECTORPRESS_PORTABLE_CPU is set"
        )
    if (
        torch.backends.quantized.engine not in ("x86", "fbgemm")
        or "fbgemm" not in engines
        or not hasattr(torch.ops.quantized, _LINEAR)
    ):
        raise StartupError(
            "--dtype int8 needs PyTorch's fbgemm int8 kernels (x86 CPUs, torch >= 2.1); this "
            f"build has {', '.join(engines)}"
        )


def int8_missing() -> str | None:
    """Why `--dtype int8` cannot run here (`int8_ready`'s error), or None where it can."""
    try:
        int8_ready()
    except StartupError as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class Int8Weights:
    """A linear layer's weights in int8 (without bias) for fbgemm's GEMM and oneDNN's (either
    may be dropped once start-up has chosen, `keep`), the per-input-channel factor that undoes
    their smoothing on the activation side, and the fixed range its inputs' rows are scaled
    into: [-low, 1], quantized to u8 on `in_scale` and `in_zero`."""

    packed: Any  # fbgemm's prepacked weight (a torch script object), or None
    linear: Any  # fbgemm's int8 linear (`_LINEAR`), looked up once
    onednn_packed: torch.Tensor | None  # oneDNN's, reordered for its GEMM
    weight_scales: torch.Tensor  # per output channel, float32 (oneDNN's)
    weight_zeros: torch.Tensor  # all 0 (symmetric), as oneDNN's GEMM takes them
    unsmooth: torch.Tensor
    low: float
    in_scale: float
    in_step: float  # 1 / in_scale as fbgemm's quantization finds it (`_step`)
    in_zero: int
    rows: RowScaling = TORCH_ROWS
    # The weights as int8 values (out, in), kept until start-up has laid them out for the short
    # passes' kernel (`int8_kernel.py`) or chosen not to (`keep`).
    values: torch.Tensor | None = None

    @classmethod
    def of(
        cls,
        weight: torch.Tensor,
        smooth: torch.Tensor,
        low: float = 1.0,
        rows: RowScaling = TORCH_ROWS,
    ) -> Int8Weights:
        w = weight.detach().float() * smooth
        scale = (w.abs().amax(1) / WEIGHT_LEVELS).clamp_min(1e-12)
        zeros = torch.zeros(w.shape[0], dtype=torch.long)
        with warnings.catch_warnings():
            # Quantized tensors are deprecated as a user API; fbgemm's prepack still takes one.
            warnings.simplefilter("ignore")
            q = torch.quantize_per_channel(w, scale.double(), zeros, 0, torch.qint8)
            packed = torch.ops.quantized.linear_prepack(q, None)
        low = row_range(low)
        in_scale = (1 + low) / 255
        linear = getattr(torch.ops.quantized, _LINEAR)
        layer = cls(
            packed,
            linear,
            None,
            q.q_per_channel_scales().float(),
            zeros,
            (1.0 / smooth).contiguous(),
            low,
            in_scale,
            _step(in_scale),
            round(low / in_scale),
            rows,
            q.int_repr(),
        )
        if onednn_int8_missing() is not None:
            return layer
        return layer._with_onednn()

    def _with_onednn(self) -> Int8Weights:
        """This layer with oneDNN's packed weights too, where its GEMM gives fbgemm's results
        on a probe (to the last bits the two round differently)."""
        weight = self.values
        assert weight is not None
        try:
            both = dataclasses.replace(
                self, onednn_packed=torch.ops.onednn.qlinear_prepack(weight, None)
            )
            probe = torch.randn(
                7, weight.shape[1], generator=torch.Generator().manual_seed(0)
            ).clamp_min(-self.low)
            got, want = both(probe, onednn=True), both(probe, onednn=False)
        except (RuntimeError, TypeError, AttributeError):
            return self
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-4 * (1 + float(want.abs().max()))):
            return self
        return both

    @property
    def kernels(self) -> tuple[str, ...]:
        """The GEMMs this layer can run on."""
        return tuple(
            name
            for name, packed in (("fbgemm", self.packed), ("oneDNN", self.onednn_packed))
            if packed is not None
        )

    def keep(self, onednn: bool) -> Int8Weights:
        """This layer with only the GEMM chosen for every pass (where it has that one), its
        int8 values dropped."""
        if onednn and self.onednn_packed is not None:
            return dataclasses.replace(self, packed=None, values=None)
        if not onednn and self.packed is not None:
            return dataclasses.replace(self, onednn_packed=None, values=None)
        return dataclasses.replace(self, values=None)

    def __call__(
        self,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        onednn: bool = True,
        gelu: bool = False,
    ) -> torch.Tensor:
        """`x @ weight.T + bias`, GELU'd (erf) where asked, with each row of `x` quantized on
        its own scale, on oneDNN's GEMM where asked and held (else fbgemm's)."""
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        # Every row is scaled into [-low, 1] (a row that goes lower than its layer met in
        # calibration gets a coarser scale, not clipped) and quantized on that fixed range, so
        # that a text's vector does not depend on its batch-mates. `low` (calibrated) < 1
        # gives one-sided inputs, as after GELU, a finer scale: on all-MiniLM-L6-v2 the FFN
        # outputs' inputs have low 0.77-0.97, and the lowest cosine to float32 on the corpus
        # rose from 0.9919 with [-1, 1] to 0.9927.
        y: torch.Tensor
        if self.onednn_packed is not None and (onednn or self.packed is None):
            q = workspace(x.shape[0], shape[-1], torch.uint8)
            scale = self.rows.quantize(x, self.unsmooth, self.low, self.in_step, self.in_zero, q)
            y = torch.ops.onednn.qlinear_pointwise(
                q,
                self.in_scale,
                self.in_zero,
                self.onednn_packed,
                self.weight_scales,
                self.weight_zeros,
                None,
                1.0,
                0,
                torch.float32,
                "none",
                [],
                "",
            )
        else:
            body = workspace(x.shape[0], shape[-1])
            scale = self.rows.scale(x, self.unsmooth, self.low, body)
            y = self.linear(body, self.in_scale, self.in_zero, self.packed)
        y = self.rows.finish(y, scale, bias, gelu)
        return y.view(*shape[:-1], y.shape[-1])


def _step(scale: float) -> float:
    """1 / scale as fbgemm finds it (in float32, from the float32 scale), so that the u8 rows
    oneDNN's GEMM takes are those fbgemm's quantizes from the float32 rows."""
    return float(np.float32(1.0) / np.float32(scale))


def keep_int8_gemm(encoder: nn.Module, onednn: bool) -> None:
    """Every int8 layer of `encoder` on the GEMM start-up chose (the other's weights freed)."""
    for linear in fused_linears(encoder):
        if linear.int8 is not None:
            linear.int8 = linear.int8.keep(onednn)


def quantize_linears(
    encoder: nn.Module,
    forward: Callable[[], tuple[torch.Tensor, PackedSequences]],
    alpha: float = ALPHA,
    rows: RowScaling = TORCH_ROWS,
) -> float:
    """Calibrate on `forward` (the calibration batch through the encoder), turn every
    FusedLinear of `encoder` to int8, and return the lowest cosine between the int8 and the
    float32 mean of a calibration text's last hidden states."""
    linears = fused_linears(encoder)
    if not linears:
        raise StartupError(f"{type(encoder).__name__} has no int8 path (no fused linears)")
    amax: dict[int, torch.Tensor] = {}
    smooth: dict[int, torch.Tensor] = {}
    low: dict[int, float] = {}

    def record_amax(linear: FusedLinear, x: torch.Tensor) -> None:
        seen = x.detach().reshape(-1, x.shape[-1]).abs().amax(0).float()
        before = amax.get(id(linear))
        amax[id(linear)] = seen if before is None else torch.maximum(before, seen)

    def record_low(linear: FusedLinear, x: torch.Tensor) -> None:
        t = x.detach().reshape(-1, x.shape[-1]).float() / smooth[id(linear)]
        ratio = -t.amin(1) / t.amax(1).clamp_min(1e-12)
        low[id(linear)] = max(low.get(id(linear), 0.0), float(ratio.max()))

    with torch.inference_mode():
        with observe_linears(record_amax):
            reference, seqs = forward()
        for linear in linears:
            smooth[id(linear)] = smoothing(linear.weight, amax.get(id(linear)), alpha)
        with observe_linears(record_low):
            forward()
        for linear in linears:
            linear.int8 = Int8Weights.of(
                linear.weight, smooth[id(linear)], low.get(id(linear), 1.0), rows
            )
        ran: set[int] = set()
        plain = [m for m in encoder.modules() if isinstance(m, nn.Linear)]
        hooks = [m.register_forward_hook(lambda m, *_: ran.add(id(m))) for m in plain]
        try:
            quantized, _ = forward()
        finally:
            for hook in hooks:
                hook.remove()
    _release_float_weights(linears, [m for m in plain if id(m) not in ran])
    return _min_cosine(reference.float(), quantized.float(), seqs)


def _release_float_weights(quantized: list[FusedLinear], unused: list[nn.Linear]) -> None:
    """Free the float32 weights that int8 no longer reads: the quantized layers' own (merged
    copies, or views of the state dict's) and those of the nn.Linear modules the fused forward
    never called. Their biases stay: the int8 path adds them. On all-MiniLM-L6-v2 that is about
    53 MB of the 90 MB of weights."""
    for linear in quantized:
        linear.release_float()
    for module in unused:
        module.weight = nn.Parameter(module.weight.new_empty(0), requires_grad=False)


def _min_cosine(a: torch.Tensor, b: torch.Tensor, seqs: PackedSequences) -> float:
    cos = [
        float(torch.cosine_similarity(a[s : s + n].mean(0), b[s : s + n].mean(0), dim=0))
        for s, n in zip(seqs.starts, seqs.lengths, strict=True)
    ]
    return min(cos)
