"""Short CPU passes of post-LayerNorm encoders (BERT, DistilBERT, MPNet) on a small compiled
kernel (`short_kernel.c`), where start-up timed it faster than the other short paths
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
(libmvec's exp), short passes keep their other paths. Post-LayerNorm layers with erf GELU (BERT,
RoBERTa, XLM-R, DistilBERT; MPNet with its relative position bias): the bundled model and most
sentence encoders.

A bfloat16 model's short passes run on it too. Where the CPU has AMX, its linears multiply
inputs rounded to bfloat16 by the bfloat16 weights on AMX's tiles (float32 sums), and every
step's values are rounded to bfloat16 where the model's own ops round them (each linear's
output, the residual sums, the GELU, the LayerNorms, attention's output): on the AMX Xeon,
all-MiniLM-L6-v2's 16-token query took 1.23-1.27 ms in-process against 2.95-3.62 natively in
bfloat16 and 2.24-2.43 on the float32 kernel, all-mpnet-base-v2's 8.9-9.3 against 17.2-18.2
and 23.5-24.5; over the 634 corpus texts under 64 tokens, the lowest cosine to float32 was
0.99991 (MiniLM) and 0.99921 (mpnet) against the bfloat16 model's 0.99990 and 0.99918. Not
rounding there (float32 between the linears, more exact) put one mpnet text at 0.9972, where
the model gives 0.9999: its outlier dimension follows the model's roundings. Elsewhere the
bfloat16 weights run on the float32 path (the same values, nothing rounded; mpnet's lowest
0.99920, that text 0.99966).

The same library holds the ops longer float32 and bfloat16 passes call (`f32_kernels.py`,
`bf16_kernels.py`).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any, Protocol, TypeGuard, runtime_checkable

import numpy as np
import torch
from torch import nn

from vectorpress.backends.common.huge_pages import on_huge_pages
from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.torch.blocks import EmbeddingSum, PostNormParts
from vectorpress.backends.torch.layers import portable_cpu
from vectorpress.cpus import cpu_flags

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
TILE_K, TILE_ROWS = 32, 16  # the kernel's
COMPILE_TIMEOUT = 120.0
# A bfloat16 model's weights on the float32 path (no AMX) kept in bfloat16 and widened as the
# kernel reads them, rather than widened once into float32 copies twice their size: the same
# sums, from half the bytes (all-MiniLM-L6-v2's 20 MiB then stay in a 32 MiB L3). Its 16-token
# pass 2.29-2.49 -> 1.94-2.08 ms, 5 tokens 1.38 -> 0.87; all-mpnet-base-v2's 10 tokens
# 13.5-14.5 -> 10.4-11.5 (Zen 4, in-process, alternated).
HALF_PANELS = True
# The first arguments of the library's encoder calls (float32's and int8's).
ENCODER_ARGS: list[type[ctypes._SimpleCData[Any]]] = [
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
]


@runtime_checkable
class PostNormEncoder(Protocol):
    """A model file's encoder the kernel can run: its embeddings, its layers' modules, and the
    additive score bias its attention adds (None for none)."""

    def embed(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor: ...

    def layer_parts(self) -> list[PostNormParts]: ...

    def embedding_sum(self) -> EmbeddingSum: ...

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
    """The compiled kernel (compiled here on first use), or None (logged) where it cannot run.
    Loaded once per process, cache folder and compiler: a model's kernels, int8's row scaling
    and the short-pass kernel share one handle (each load had run the compiler once more for
    its version)."""
    if portable_cpu() or torch.backends.cpu.get_cpu_capability() != "AVX512":
        return None
    if not _torch_openmp_is_libgomp():
        log.info("the short-pass kernel is not built: torch runs on another OpenMP runtime")
        return None
    compiler = _compiler()
    if compiler is None:
        log.info("the short-pass kernel is not built: no C compiler (set CC)")
        return None
    key = (cache_dir, compiler)
    with _loading:
        lib = _loaded.get(key)
        if lib is None:
            lib = _build_and_load(cache_dir, compiler)
            if lib is not None:
                _loaded[key] = lib
    return lib


_loaded: dict[tuple[Path, str], ctypes.CDLL] = {}
_loading = threading.Lock()


def _build_and_load(cache_dir: Path, compiler: str) -> ctypes.CDLL | None:
    """The library built into `cache_dir` where it is not there yet, then loaded."""
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
        *ENCODER_ARGS,
        ctypes.c_void_p,  # scratch
        ctypes.c_int,  # threads
        ctypes.c_int,  # bf16
        ctypes.c_int,  # half
    ]
    lib.vp_amx_ready.restype = ctypes.c_int
    lib.vp_amx_ready.argtypes = []
    lib.vp_embed_norm.restype = ctypes.c_int
    lib.vp_embed_norm.argtypes = [
        ctypes.c_void_p,  # tables
        ctypes.c_void_p,  # ids
        ctypes.c_void_p,  # sizes
        ctypes.c_int64,  # n_tables
        ctypes.c_int64,  # rows
        ctypes.c_int64,  # hidden
        ctypes.c_void_p,  # w
        ctypes.c_void_p,  # b
        ctypes.c_float,  # eps
        ctypes.c_void_p,  # out
    ]
    lib.vp_pool.restype = None
    lib.vp_pool.argtypes = [
        ctypes.c_void_p,  # x
        ctypes.c_void_p,  # cu
        ctypes.c_int64,  # seqs
        ctypes.c_int64,  # hidden
        ctypes.c_int,  # first
        ctypes.c_void_p,  # out
    ]
    return lib


def amx_ready(lib: ctypes.CDLL) -> bool:
    """Whether the kernel may run bfloat16 linears on AMX here (asking Linux for its tiles)."""
    return "amx_bf16" in cpu_flags() and bool(lib.vp_amx_ready())


def panels(weight: torch.Tensor) -> torch.Tensor:
    """A linear's `(out, in)` weight in the kernel's layout, the columns past `out` zero:
    float32 as `float_panels`; bfloat16 as AMX's tiles read it,
    `[ceil(out / PANEL)][width / 2][PANEL][2]`, each column's inputs in pairs, `in` padded with
    zero inputs to `width`, a multiple of TILE_K."""
    out, inner = weight.shape
    if weight.dtype != torch.bfloat16:
        return float_panels(weight)
    count = -(-out // PANEL)
    width = _tiled(inner)
    padded = weight.new_zeros(count * PANEL, width)
    padded[:out, :inner] = weight
    return padded.view(count, PANEL, width // 2, 2).transpose(1, 2).contiguous()


def float_panels(weight: torch.Tensor) -> torch.Tensor:
    """A linear's `(out, in)` weight as the float32 path reads it (float32, or bfloat16 that it
    widens): `[ceil(out / PANEL)][in][PANEL]`, the columns past `out` zero."""
    out, inner = weight.shape
    count = -(-out // PANEL)
    padded = weight.new_zeros(count * PANEL, inner)
    padded[:out] = weight
    return padded.view(count, PANEL, inner).transpose(1, 2).contiguous()


def _aligned(n: int) -> tuple[np.ndarray, int]:
    """Room for `n` float32s from a 64-byte boundary, as torch's allocator places them, and its
    address: from numpy's 16-byte one the kernel's vector loads and stores split cache lines
    (a 16-token pass 2-4% slower, in-process, alternated)."""
    raw = np.empty(n + 15, np.float32)
    start = _address(raw)
    skip = (-start % 64) // 4
    return raw[skip : skip + n], start + 4 * skip


def _address(array: np.ndarray) -> int:
    """Where `array`'s data starts: `array.ctypes.data` without the object that attribute
    builds in Python for each read."""
    return int(array.__array_interface__["data"][0])


def _tiled(n: int, step: int = TILE_K) -> int:
    return -(-n // step) * step


def _bias(linear: nn.Linear) -> torch.Tensor:
    if linear.bias is not None:
        return linear.bias.detach()
    return linear.weight.detach().new_zeros(linear.out_features)


class ShortKernel:
    """The encoder's last hidden states from the compiled kernel, in the packed layout: called
    as the native encoder is, `(input_ids, token_type_ids, position_ids, seqs)`. In float32
    whatever the encoder's dtype (float32 or bfloat16: its linears' weights)."""

    def __init__(self, lib: ctypes.CDLL, encoder: PostNormEncoder) -> None:
        self.lib = lib
        self.encoder = encoder
        layers = encoder.layer_parts()
        self.heads = layers[0].heads
        self.hidden, self.inner = layers[0].ffn[0].in_features, layers[0].ffn[0].out_features
        # A bfloat16 model's linears on AMX; elsewhere on the float32 path, their weights
        # widened (the same values) as the kernel reads them, or before (HALF_PANELS).
        bf16_weights = layers[0].ffn[0].weight.dtype == torch.bfloat16
        self.bf16 = bf16_weights and amx_ready(lib)
        self.half = bf16_weights and not self.bf16 and HALF_PANELS
        self.widest = _tiled(max(self.hidden, self.inner)) if self.bf16 else 0
        self.keep: list[torch.Tensor] = []  # what the pointers point at

        def ptr(t: torch.Tensor) -> int:
            t = t.detach().contiguous()
            self.keep.append(t)
            return t.data_ptr()

        def weights(t: torch.Tensor) -> torch.Tensor:
            if self.bf16:
                return panels(t)
            return float_panels(t if self.half else t.float())

        table = (_Layer * len(layers))()
        linears_of = [
            (
                ("qkv", parts.qkv),
                ("attn_out", (parts.attn_out,)),
                ("ffn_in", (parts.ffn[0],)),
                ("ffn_out", (parts.ffn[1],)),
            )
            for parts in layers
        ]
        # Every pass reads all of them: on huge pages (huge_pages.py says why).
        placed = iter(
            on_huge_pages(
                [
                    weights(torch.cat([lin.weight.detach() for lin in linears]))
                    for named in linears_of
                    for _, linears in named
                ]
            )
        )
        for entry, parts, named in zip(table, layers, linears_of, strict=True):
            for name, linears in named:
                setattr(entry, name, ptr(next(placed)))
                bias = torch.cat([_bias(lin) for lin in linears]).float()
                setattr(entry, f"{name}_bias", ptr(bias))
            norm1, norm2 = parts.attn_norm, parts.ffn_norm
            entry.norm1, entry.norm1_bias = ptr(norm1.weight.float()), ptr(norm1.bias.float())
            entry.norm2, entry.norm2_bias = ptr(norm2.weight.float()), ptr(norm2.bias.float())
            entry.eps1, entry.eps2 = norm1.eps, norm2.eps
        self.table = table
        self.n_layers = len(layers)
        # A bfloat16 model's embeddings stay with its module (they round as it rounds).
        embedding = _Embedding(lib, encoder.embedding_sum())
        self.embedding = embedding if embedding.usable else None

    def __call__(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        position_ids: torch.Tensor,
        seqs: PackedSequences,
    ) -> torch.Tensor:
        x, bias, span, cu = kernel_inputs(
            self.encoder, input_ids, token_type_ids, position_ids, seqs, self.embedding
        )
        rows = x.shape[0]
        scratch = torch.empty(self._work(rows))
        self._layers(
            x.data_ptr(), rows, cu.data_ptr(), seqs.size, bias, span, scratch.data_ptr(),
            torch.get_num_threads(),
        )  # fmt: skip
        return x

    def pooled(
        self,
        ids: np.ndarray,
        types: np.ndarray,
        positions: np.ndarray,
        cu: np.ndarray,
        longest: int,
        first: bool,
        threads: int,
    ) -> np.ndarray | None:
        """The vectors of a pass's sequences (`cu`: their int32 bounds): each one's first
        token's hidden state (`first`) or their mean, as `pool` gives them, from the batch's own
        int64 arrays, with no torch op between the embeddings and the vectors: right after a
        pass has streamed the weights through the caches each torch op costs several times its
        warm price, and the ones around the kernel (the embeddings' inputs, the bounds, the
        pooling) took about 0.4 ms of a short query's 2.5 in a server (docs/performance.md).
        None where the model's embedding module must run."""
        embedding = self.embedding
        rows = len(ids)
        if embedding is None or not rows:
            return None
        # The library reads them as they are: no-ops on a Batch's own arrays.
        ids = np.ascontiguousarray(ids, np.int64)
        types = np.ascontiguousarray(types, np.int64)
        positions = np.ascontiguousarray(positions, np.int64)
        cu = np.ascontiguousarray(cu, np.int32)
        x, at = _aligned(rows * self.hidden)
        if not embedding.write((ids, types, positions), rows, at):
            return None
        bias = score_bias(self.encoder, longest)
        seqs = len(cu) - 1
        bounds = _address(cu)
        room, scratch = _aligned(self._work(rows))
        self._layers(at, rows, bounds, seqs, bias, longest, scratch, threads)
        out, into = _aligned(seqs * self.hidden)
        self.lib.vp_pool(at, bounds, seqs, self.hidden, first, into)
        del x, room  # the arrays behind the addresses, held until the library is done
        return out.reshape(seqs, self.hidden)

    def _work(self, rows: int) -> int:
        """Floats of room a pass of `rows` needs, the bfloat16 linears' inputs (whole tiles
        of them) after the float32 values."""
        return rows * (5 * self.hidden + self.inner) + _tiled(rows, TILE_ROWS) * self.widest // 2

    def _layers(
        self,
        x: int,
        rows: int,
        cu: int,
        seqs: int,
        bias: torch.Tensor | None,
        span: int,
        work: int,
        threads: int,
    ) -> None:
        """The layers over x[rows, hidden] in place (`bias`: float32, contiguous)."""
        self.lib.vp_post_norm_encoder(
            ctypes.addressof(self.table),
            self.n_layers,
            x,
            rows,
            self.hidden,
            self.inner,
            self.heads,
            cu,
            seqs,
            bias.data_ptr() if bias is not None else None,
            span,
            work,
            threads,
            int(self.bf16),
            int(self.half),
        )


class _Embedding:
    """A float32 model's embeddings on the kernel's `vp_embed_norm` (the same sums, the
    LayerNorm as the kernel's layers run theirs) where `usable` (float32 tables and norm), or
    None from a call where an id is outside its table: the model's module then runs them
    (and says what is wrong)."""

    def __init__(self, lib: ctypes.CDLL, parts: EmbeddingSum) -> None:
        self.run = lib.vp_embed_norm
        tables = [table.weight.detach() for table, _ in parts.tables]
        norm = parts.norm
        self.usable = all(t.dtype == torch.float32 and t.is_contiguous() for t in tables) and (
            norm.weight is not None
            and norm.bias is not None
            and norm.weight.dtype == torch.float32
            and norm.bias.dtype == torch.float32
        )
        self.keep = tables  # what the pointers point at
        self.tables = (ctypes.c_void_p * len(tables))(*[t.data_ptr() for t in tables])
        self.sizes = (ctypes.c_int64 * len(tables))(*[t.shape[0] for t in tables])
        self.inputs = [which for _, which in parts.tables]
        self.hidden = tables[0].shape[1]
        self.norm = norm

    def __call__(self, ids: tuple[torch.Tensor, ...]) -> torch.Tensor | None:
        rows = ids[0].shape[0]
        read = [ids[i].to(torch.int64).contiguous() if i is not None else None for i in self.inputs]
        out = torch.empty(rows, self.hidden)
        done = self._write(
            [t.data_ptr() if t is not None else None for t in read], rows, out.data_ptr()
        )
        return out if done else None

    def write(self, ids: tuple[np.ndarray, ...], rows: int, out: int) -> bool:
        """The embeddings of `ids` (contiguous int64 arrays: input ids, token types, positions)
        written at `out`; False (nothing written) where an id is outside its table."""
        return self._write(
            [_address(ids[i]) if i is not None else None for i in self.inputs], rows, out
        )

    def _write(self, ids: list[int | None], rows: int, out: int) -> bool:
        norm = self.norm
        done = self.run(
            self.tables,
            (ctypes.c_void_p * len(ids))(*ids),
            self.sizes,
            len(ids),
            rows,
            self.hidden,
            norm.weight.data_ptr(),
            norm.bias.data_ptr(),
            norm.eps,
            out,
        )
        return bool(done == 0)


def kernel_inputs(
    encoder: PostNormEncoder,
    input_ids: torch.Tensor,
    token_type_ids: torch.Tensor,
    position_ids: torch.Tensor,
    seqs: PackedSequences,
    embedding: _Embedding | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, int, torch.Tensor]:
    """What a kernel's encoder call takes for a pass: its embeddings (float32, written over
    by the kernel; from `embedding` where given and it can), the score bias of its longest
    sequence (or None) and that length, and the sequences' bounds (int32)."""
    with torch.inference_mode():
        x = embedding((input_ids, token_type_ids, position_ids)) if embedding else None
        if x is None:
            x = encoder.embed(input_ids, token_type_ids, position_ids).float().contiguous()
        span = max(seqs.lengths)
        bias = score_bias(encoder, span)
    return x, bias, span, seqs.cu_seqlens.to(torch.int32).contiguous()


def score_bias(encoder: PostNormEncoder, span: int) -> torch.Tensor | None:
    """The encoder's score bias for sequences of up to `span` tokens as the kernels read it
    (float32, contiguous), or None."""
    bias = encoder.score_bias(span)
    return None if bias is None else bias.float().contiguous()


def kernel_fits(encoder: nn.Module, dtype: torch.dtype) -> TypeGuard[PostNormEncoder]:
    """Whether `encoder` is the kernel's: post-LayerNorm layers with erf GELU and LayerNorm
    biases, in float32 or bfloat16."""
    if dtype not in (torch.float32, torch.bfloat16) or not isinstance(encoder, PostNormEncoder):
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
