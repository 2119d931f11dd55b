"""Short float32 CPU passes of post-LayerNorm encoders (BERT, DistilBERT, MPNet) on a small
compiled kernel
(`short_kernel.c`), where start-up timed it faster than the other short paths
(`passes.plan_passes`).

A one-query pass multiplies a few rows by every weight matrix, and the libraries' GEMMs are
built for many rows: on the AVX-512 Xeon, the 24 linears of all-MiniLM-L6-v2 on a 16-token
query ran at 45-52% of the GEMM ceiling on oneDNN, MKL's packed sgemm and ONNX Runtime alike,
while the weights, held in the last-level cache between queries, can be read at 55 GB/s on two
threads (the GEMMs need 8 FLOPs a byte: the cache would feed more than the cores' peak). The
kernel's linears take each weight panel once for eight rows at a time, with the bias, the
residual and the GELU in the same pass over the outputs, and a whole layer (attention and
LayerNorm included) runs in one OpenMP region of the team torch's own ops use (the kernel
links the libgomp torch loaded): the 24 linears alone ran 1.4 ms against oneDNN's 2.4 and
MKL's 2.0 with their weights in the caches, and 3.7 on oneDNN with every layer's own weights.

It is compiled once with the system's C compiler (`$CC`, else `cc`) into the build cache and
loaded from there after; where there is no compiler, no AVX-512 or no glibc vector math
(libmvec's erf), short passes keep their other paths. Float32 only, post-LayerNorm layers with
erf GELU (BERT, RoBERTa, XLM-R, DistilBERT; MPNet with its relative position bias): the bundled
model and most sentence encoders.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Protocol, TypeGuard, runtime_checkable

import torch
from torch import nn

from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.torch.blocks import PostNormParts
from vectorpress.backends.torch.layers import portable_cpu

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("short_kernel.c")
# Named instruction sets rather than -march=native: the cache may be shared by machines.
FLAGS = [
    "-O3",
    "-mavx512f",
    "-mavx512dq",
    "-mavx512vl",
    "-mavx512bw",
    "-mfma",
    "-fopenmp",
    "-shared",
    "-fPIC",
]
LIBS = ["-lmvec", "-lm"]
PANEL = 48  # the kernel's PANEL
COMPILE_TIMEOUT = 120.0


@runtime_checkable
class PostNormEncoder(Protocol):
    """A model file's encoder the kernel can run: its embeddings, its layers' modules, and the
    additive score bias its attention adds (None for none)."""

    def embed(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor: ...

    def layer_parts(self) -> list[PostNormParts]: ...

    def score_bias(self, length: int) -> torch.Tensor | None: ...


class _Layer(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_void_p)
        for name in (
            "qkv",
            "qkv_bias",
            "attn_out",
            "attn_out_bias",
            "norm1",
            "norm1_bias",
            "ffn_in",
            "ffn_in_bias",
            "ffn_out",
            "ffn_out_bias",
            "norm2",
            "norm2_bias",
        )
    ] + [("eps1", ctypes.c_float), ("eps2", ctypes.c_float)]


def _torch_openmp_is_libgomp() -> bool:
    """Whether the OpenMP runtime in this process is a libgomp (torch's wheels bring one): the
    kernel's libgomp.so.1 then resolves to it. Under another runtime (libiomp) it would load a
    second one, whose threads would spin beside torch's."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return False
    return "/libgomp" in maps


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc"))


def _library_path(cache_dir: Path, compiler: str) -> Path:
    version = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    key = hashlib.sha256(
        "\0".join([SOURCE.read_text(), *FLAGS, *LIBS, version]).encode()
    ).hexdigest()[:16]
    return cache_dir / "kernels" / f"short_kernel-{key}.so"


def load_library(cache_dir: Path) -> ctypes.CDLL | None:
    """The compiled kernel (compiled here on first use), or None (logged) where it cannot run."""
    if portable_cpu() or torch.backends.cpu.get_cpu_capability() != "AVX512":
        return None
    if not _torch_openmp_is_libgomp():
        log.info("the short-pass kernel is not built: torch runs on another OpenMP runtime")
        return None
    compiler = _compiler()
    if compiler is None:
        log.info("the short-pass kernel is not built: no C compiler (set CC)")
        return None
    try:
        path = _library_path(cache_dir, compiler)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            # Written beside its place and renamed: a server starting beside this one never
            # loads half a file.
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".so")
            os.close(fd)
            try:
                done = subprocess.run(
                    [compiler, *FLAGS, str(SOURCE), "-o", tmp, *LIBS],
                    capture_output=True,
                    text=True,
                    timeout=COMPILE_TIMEOUT,
                    check=False,
                )
                if done.returncode != 0:
                    log.info(
                        "the short-pass kernel is not built: %s failed: %s",
                        compiler,
                        done.stderr.strip()[-500:],
                    )
                    return None
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        # torch loaded its libgomp already; the kernel's libgomp.so.1 resolves to it, so its
        # parallel regions use the team torch's ops use (a second OpenMP runtime would keep
        # a second team of threads spinning on the same cores).
        lib = ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError) as exc:
        log.info("the short-pass kernel is not built: %s", exc)
        return None
    lib.vp_post_norm_encoder.restype = None
    lib.vp_post_norm_encoder.argtypes = [
        ctypes.c_void_p,  # layers
        ctypes.c_int64,  # n_layers
        ctypes.c_void_p,  # x
        ctypes.c_int64,  # rows
        ctypes.c_int64,  # hidden
        ctypes.c_int64,  # inner
        ctypes.c_int64,  # heads
        ctypes.c_void_p,  # cu
        ctypes.c_int64,  # seqs
        ctypes.c_void_p,  # bias
        ctypes.c_int64,  # span
        ctypes.c_void_p,  # scratch
        ctypes.c_int,  # threads
    ]
    return lib


def panels(weight: torch.Tensor) -> torch.Tensor:
    """A linear's `(out, in)` weight in the kernel's layout: `[ceil(out / PANEL)][in][PANEL]`,
    the columns past `out` zero."""
    out, inner = weight.shape
    count = -(-out // PANEL)
    padded = weight.new_zeros(count * PANEL, inner)
    padded[:out] = weight
    return padded.view(count, PANEL, inner).transpose(1, 2).contiguous()


def _bias(linear: nn.Linear) -> torch.Tensor:
    if linear.bias is not None:
        return linear.bias.detach()
    return linear.weight.detach().new_zeros(linear.out_features)


class ShortKernel:
    """The encoder's last hidden states from the compiled kernel, in the packed layout: called
    as the native encoder is, `(input_ids, token_type_ids, position_ids, seqs)`."""

    def __init__(self, lib: ctypes.CDLL, encoder: PostNormEncoder) -> None:
        self.lib = lib
        self.encoder = encoder
        layers = encoder.layer_parts()
        self.heads = layers[0].heads
        self.hidden, self.inner = layers[0].ffn[0].in_features, layers[0].ffn[0].out_features
        self.keep: list[torch.Tensor] = []  # what the pointers point at

        def ptr(t: torch.Tensor) -> int:
            t = t.detach().float().contiguous()
            self.keep.append(t)
            return t.data_ptr()

        table = (_Layer * len(layers))()
        for entry, parts in zip(table, layers, strict=True):
            for name, linears in (
                ("qkv", parts.qkv),
                ("attn_out", (parts.attn_out,)),
                ("ffn_in", (parts.ffn[0],)),
                ("ffn_out", (parts.ffn[1],)),
            ):
                setattr(entry, name, ptr(panels(torch.cat([lin.weight for lin in linears]))))
                setattr(entry, f"{name}_bias", ptr(torch.cat([_bias(lin) for lin in linears])))
            norm1, norm2 = parts.attn_norm, parts.ffn_norm
            entry.norm1, entry.norm1_bias = ptr(norm1.weight), ptr(norm1.bias)
            entry.norm2, entry.norm2_bias = ptr(norm2.weight), ptr(norm2.bias)
            entry.eps1, entry.eps2 = norm1.eps, norm2.eps
        self.table = table
        self.n_layers = len(layers)

    def __call__(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        position_ids: torch.Tensor,
        seqs: PackedSequences,
    ) -> torch.Tensor:
        with torch.inference_mode():
            x = self.encoder.embed(input_ids, token_type_ids, position_ids).contiguous()
            span = max(seqs.lengths)
            bias = self.encoder.score_bias(span)
            if bias is not None:
                bias = bias.float().contiguous()
        rows = x.shape[0]
        cu = seqs.cu_seqlens.to(torch.int32).contiguous()
        scratch = torch.empty(rows * (5 * self.hidden + self.inner))
        self.lib.vp_post_norm_encoder(
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
            scratch.data_ptr(),
            torch.get_num_threads(),
        )
        return x


def kernel_fits(encoder: nn.Module, dtype: torch.dtype) -> TypeGuard[PostNormEncoder]:
    """Whether `encoder` is the kernel's: post-LayerNorm layers with erf GELU and LayerNorm
    biases, in float32."""
    if dtype != torch.float32 or not isinstance(encoder, PostNormEncoder):
        return False
    layers = encoder.layer_parts()
    return bool(layers) and all(
        parts.act == "gelu"
        and parts.attn_norm.bias is not None
        and parts.ffn_norm.bias is not None
        and parts.attn_out.in_features == parts.ffn[0].in_features
        for parts in layers
    )


def kernel_candidate(encoder: nn.Module, dtype: torch.dtype, cache_dir: Path) -> ShortKernel | None:
    """A ShortKernel for `encoder`, or None where the kernel does not fit or build."""
    if not kernel_fits(encoder, dtype):
        return None
    lib = load_library(cache_dir)
    return ShortKernel(lib, encoder) if lib is not None else None
