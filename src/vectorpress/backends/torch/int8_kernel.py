"""int8 passes of a post-LayerNorm encoder on the compiled kernel (`short_kernel.c`'s
`vp_int8_post_norm_encoder`), where the CPU has AVX512-VNNI and start-up keeps oneDNN's int8
GEMM: short passes (under `passes.SMALL_PASS_TOKENS`) where the kernel ran them faster than the
model's modules, and the longer ones too where it also ran the larger pass faster.

Through the model's own modules a one-query int8 pass was slower than float32's short pass on
its kernel: on a Zen 4 (2 cores), all-MiniLM-L6-v2's 10-token query took 3.8-4.4 ms in-process
against 2.5-2.6, of which oneDNN's 24 int8 GEMMs took 1.43 ms and the Python and op calls
around them most of the rest. The kernel runs every layer in one call: each linear's rows are
quantized as the modules' passes quantize them, multiplied by the int8 weights on VNNI's dot
products (the weights laid out in panels of 48 columns by fours of inputs), and their sums taken
back to float32 as oneDNN's GEMM takes its own (the zero point's share subtracted, times the
input's scale, then the column's: checked against oneDNN's outputs to the bit on 1 to 2,048
rows) and finished by the function the module passes finish theirs with; attention and the
residual LayerNorms are the functions those call. A text's vector is then the same to the last
bit alone or among others, on the kernel or off it, and start-up checks that on a probe before
keeping the kernel.

On longer passes the kernel's GEMM (8 rows by 48 columns a block, its 24 sums held in registers)
ran all-MiniLM-L6-v2's four linear shapes at 2,048 rows at 746-769 GOP/s against oneDNN's 805
(Zen 4, 2 threads), and the whole pass, its outputs finished as they leave the registers and
without the calls between the ops, ran the 600-text corpus (batches of 32) at 24,875-25,791
tokens/s against 20,536-22,300 on the modules with oneDNN's GEMM (alternated rounds).
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from vectorpress.backends.common.huge_pages import on_huge_pages
from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.torch.bf16_kernels import RoundedAttention
from vectorpress.backends.torch.blocks import FusedPostNormLayer
from vectorpress.backends.torch.cpu_kernels import CpuKernels
from vectorpress.backends.torch.f32_kernels import FloatAttention
from vectorpress.backends.torch.int8 import workspace
from vectorpress.backends.torch.layers import FusedLinear
from vectorpress.backends.torch.short_graph import MAX_PARAMETERS
from vectorpress.backends.torch.short_kernel import (
    ENCODER_ARGS,
    PANEL,
    PostNormEncoder,
    kernel_fits,
    kernel_inputs,
)
from vectorpress.cpus import cpu_flags


class _Int8Linear(ctypes.Structure):
    _fields_ = [
        ("w", ctypes.c_void_p),
        ("zero_sums", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("unsmooth", ctypes.c_void_p),
        ("low", ctypes.c_float),
        ("step", ctypes.c_float),
        ("in_scale", ctypes.c_float),
        ("zero", ctypes.c_int32),
        ("k", ctypes.c_int64),
        ("quads", ctypes.c_int64),
        ("n", ctypes.c_int64),
    ]


class _Int8Layer(ctypes.Structure):
    _fields_ = [
        ("qkv", _Int8Linear),
        ("attn_out", _Int8Linear),
        ("ffn_in", _Int8Linear),
        ("ffn_out", _Int8Linear),
        ("norm1", ctypes.c_void_p),
        ("norm1_bias", ctypes.c_void_p),
        ("norm2", ctypes.c_void_p),
        ("norm2_bias", ctypes.c_void_p),
        ("eps1", ctypes.c_float),
        ("eps2", ctypes.c_float),
    ]


def vnni_panels(values: torch.Tensor) -> torch.Tensor:
    """An int8 linear's `(out, in)` values as the kernel reads them,
    `[ceil(out / PANEL)][ceil(in / 4)][PANEL][4]`: each column's inputs by fours (VNNI's dot
    product of four u8 by four s8), the padding zero."""
    out, inner = values.shape
    count, quads = -(-out // PANEL), -(-inner // 4)
    padded = values.new_zeros(count * PANEL, quads * 4)
    padded[:out, :inner] = values
    return padded.view(count, PANEL, quads, 4).transpose(1, 2).contiguous()


def _fused_layers(encoder: nn.Module) -> list[FusedPostNormLayer]:
    return [
        value
        for module in encoder.modules()
        for value in vars(module).values()
        if isinstance(value, FusedPostNormLayer)
    ]


class Int8Kernel:
    """The int8 encoder's last hidden states from the compiled kernel, called as the native
    encoder is, `(input_ids, token_type_ids, position_ids, seqs)`; its scratch is the calling
    thread's kept int8 workspace (a long pass's, 28 MB on all-MiniLM-L6-v2, would otherwise come
    as fresh pages each time)."""

    def __init__(
        self,
        lib: ctypes.CDLL,
        encoder: PostNormEncoder,
        fused: list[FusedPostNormLayer],
        rounded: bool,
    ) -> None:
        """`rounded`: attention on the dot products' kernel, its rows rounded, as the longer
        passes' `RoundedAttention` runs it (a model with a score bias: float32 either way)."""
        self.encoder = encoder
        self.run = lib.vp_int8_post_norm_encoder
        self.run.restype = ctypes.c_int
        self.run.argtypes = [
            *ENCODER_ARGS,
            ctypes.c_int,  # rounded
            ctypes.c_void_p,  # scratch
            ctypes.c_void_p,  # q
            ctypes.c_int,  # threads
        ]
        parts = encoder.layer_parts()
        self.heads = fused[0].heads
        self.hidden, self.inner = parts[0].ffn[0].in_features, parts[0].ffn[0].out_features
        self.rounded = rounded
        self.keep: list[torch.Tensor] = []  # what the pointers point at
        table = (_Int8Layer * len(fused))()
        linears: list[tuple[_Int8Linear, torch.Tensor]] = []
        for entry, layer, part in zip(table, fused, parts, strict=True):
            for name in ("qkv", "attn_out", "ffn_in", "ffn_out"):
                linear = getattr(entry, name)
                linears.append((linear, self._fill(linear, getattr(layer, name))))
            entry.norm1, entry.norm1_bias = self._ptr(part.attn_norm.weight, part.attn_norm.bias)
            entry.norm2, entry.norm2_bias = self._ptr(part.ffn_norm.weight, part.ffn_norm.bias)
            entry.eps1, entry.eps2 = part.attn_norm.eps, part.ffn_norm.eps
        # Every pass reads all the weights: on huge pages (huge_pages.py says why).
        placed = on_huge_pages([w for _, w in linears])
        for (linear, _), w in zip(linears, placed, strict=True):
            linear.w = w.data_ptr()
        self.keep.extend(placed)
        self.table = table
        self.n_layers = len(fused)

    def _ptr(self, *tensors: torch.Tensor) -> tuple[int, ...]:
        kept = [t.detach().float().contiguous() for t in tensors]
        self.keep.extend(kept)
        return tuple(t.data_ptr() for t in kept)

    def _fill(self, entry: _Int8Linear, linear: FusedLinear) -> torch.Tensor:
        """Sets `entry` from `linear` but for its weights, which it returns in the kernel's
        layout."""
        int8 = linear.int8
        assert int8 is not None and int8.values is not None
        values = int8.values
        n, k = values.shape
        padded = -(-n // PANEL) * PANEL

        def columns(t: torch.Tensor) -> torch.Tensor:
            out = t.new_zeros(padded)
            out[:n] = t
            return out

        sums = values.to(torch.int32).sum(1, dtype=torch.int32) * int8.in_zero
        bias = linear.bias if linear.bias is not None else torch.zeros(n)
        w = vnni_panels(values)
        zero_sums, scales, bias = (
            columns(sums),
            columns(int8.weight_scales.float()),
            columns(bias.detach().float()),
        )
        unsmooth = int8.unsmooth.float().contiguous()
        self.keep.extend([zero_sums, scales, bias, unsmooth])
        entry.zero_sums = zero_sums.data_ptr()
        entry.scales, entry.bias, entry.unsmooth = (
            scales.data_ptr(),
            bias.data_ptr(),
            unsmooth.data_ptr(),
        )
        entry.low, entry.step, entry.in_scale = int8.low, int8.in_step, int8.in_scale
        entry.zero, entry.k, entry.quads, entry.n = int8.in_zero, k, w.shape[1], n
        return w

    def __call__(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        position_ids: torch.Tensor,
        seqs: PackedSequences,
    ) -> torch.Tensor:
        x, bias, span, cu = kernel_inputs(
            self.encoder, input_ids, token_type_ids, position_ids, seqs
        )
        rows = x.shape[0]
        scratch = workspace(rows, 5 * self.hidden + self.inner + 1)
        q = workspace(rows, max(self.hidden, self.inner) + 3, torch.uint8)
        failed = self.run(
            ctypes.addressof(self.table),
            self.n_layers,
            x.data_ptr(),
            rows,
            self.hidden,
            self.inner,
            self.heads,
            cu.data_ptr(),
            seqs.size,
            bias.data_ptr() if bias is not None else None,
            span,
            int(self.rounded),
            scratch.data_ptr(),
            q.data_ptr(),
            torch.get_num_threads(),
        )
        if failed:
            raise MemoryError("the int8 pass kernel found no memory for attention")
        return x


def int8_kernel_candidate(
    lib: ctypes.CDLL | None, encoder: nn.Module, kernels: CpuKernels
) -> Int8Kernel | None:
    """An Int8Kernel for `encoder` (quantized, each layer still holding its int8 values
    and oneDNN's weights), or None where it does not fit: no library or no VNNI, not the
    kernel's layers, attention that the modules' passes do not run on the same library, or
    weights past MAX_PARAMETERS (the kernel keeps its own copy)."""
    if lib is None or "avx512_vnni" not in cpu_flags() or not lib.vp_int8_encoder_built():
        return None
    fused = _fused_layers(encoder)
    if not kernel_fits(encoder, torch.float32):
        return None
    parts = encoder.layer_parts()
    held = [
        linear.int8
        for layer in fused
        for linear in (layer.qkv, layer.attn_out, layer.ffn_in, layer.ffn_out)
    ]
    values = [w.values for w in held if w is not None and w.onednn_packed is not None]
    if len(fused) != len(parts) or any(v is None for v in values) or len(values) != len(held):
        return None
    if sum(v.numel() for v in values if v is not None) > MAX_PARAMETERS:
        return None
    attention = kernels.attention
    if isinstance(attention, RoundedAttention):
        # A call with a score bias (MPNet's) goes to its float32 kernel.
        plain = attention.with_bias if encoder.score_bias(1) is not None else attention
        rounded = not isinstance(plain, FloatAttention)
    elif isinstance(attention, FloatAttention):
        plain, rounded = attention, False
    else:
        return None
    # Both attention kernels take the same head sizes.
    dim = parts[0].ffn[0].in_features // fused[0].heads
    if plain is None or dim not in FloatAttention.head_dims:
        return None
    return Int8Kernel(lib, encoder, fused, rounded)
