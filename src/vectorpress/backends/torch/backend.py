"""TorchBackend: native model files on packed batches, with pooling and heads written once."""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import re
from pathlib import Path

import numpy as np
import torch
from torch import nn

from vectorpress.backends.common.cache import build_cache
from vectorpress.backends.common.calibration import calibration_batch
from vectorpress.backends.common.dense import load_dense
from vectorpress.backends.common.device import pick_device
from vectorpress.backends.common.loader import load_state_dict, remap, strict_load
from vectorpress.backends.common.multivector import MultiVectorHeads
from vectorpress.backends.common.pooling import (
    last_non_pad_rows,
    pool,
    splade_vectors,
)
from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.common.threads import num_threads
from vectorpress.backends.preemption import add_layer_points
from vectorpress.backends.torch.attention import varlen_usable
from vectorpress.backends.torch.bf16_kernels import bf16_kernels, rounded_attention
from vectorpress.backends.torch.blocks import FusedModel
from vectorpress.backends.torch.cpu_kernels import NONE, CpuKernels
from vectorpress.backends.torch.cuda_graphs import POOLED_IN_GRAPHS, CudaGraphs, Replayed
from vectorpress.backends.torch.f32_kernels import f32_kernels
from vectorpress.backends.torch.heads import ClassificationHead, MLMHead
from vectorpress.backends.torch.int8 import (
    INT8_PASS_TOKENS,
    compiled_rows,
    int8_ready,
    keep_int8_gemm,
    quantize_linears,
)
from vectorpress.backends.torch.int8_kernel import Int8Kernel, int8_kernel_candidate
from vectorpress.backends.torch.layers import fused_linears, onednn_supported
from vectorpress.backends.torch.passes import (
    CPU_PASS_TOKENS,
    GRAPH,
    KERNEL,
    SMALL_PASS_TOKENS,
    CpuPasses,
    PassPlan,
    Shortcut,
    plan_passes,
    plan_when_quiet,
)
from vectorpress.backends.torch.registry import Architecture, HeadRules, lookup
from vectorpress.backends.torch.short_graph import (
    MAX_PARAMETERS,
    graph_candidate,
    short_graph_fits,
)
from vectorpress.backends.torch.short_kernel import ShortKernel, kernel_candidate, load_library
from vectorpress.errors import StartupError
from vectorpress.model_spec import ModelSpec
from vectorpress.types import Batch, BatchOutput

log = logging.getLogger(__name__)

# int8 loads in float32; its linear layers are quantized after loading (`int8.py`).
_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.float32,
}


class ServedModel(nn.Module):
    """The encoder plus the head the served task needs (none for dense embeddings)."""

    def __init__(self, encoder: FusedModel, head: nn.Module | None) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head


def build_head(spec: ModelSpec, arch: Architecture) -> tuple[nn.Module | None, HeadRules | None]:
    """The head the served task needs (none for dense embeddings), untrained, and its rules."""
    cfg = spec.config
    hidden = spec.hidden_size
    if spec.llm_rerank is not None:
        if cfg.get("final_logit_softcapping"):
            raise StartupError("an LLM reranker with final logit softcapping is not supported")
        # One output: the answer logits' difference (yes - no), or the one answer's logit.
        head = ClassificationHead(hidden, 1, "identity", dense=False, out_bias=False)
        return head, HeadRules(rules=(), dense=False, out_bias=False)
    if spec.kind in ("classifier", "reranker"):
        if arch.classifier is None:
            raise StartupError(f"{spec.architecture} has no classification head in vectorpress")
        rules = arch.classifier
        return ClassificationHead(hidden, spec.num_labels, **rules.head_options(cfg)), rules
    if spec.is_splade:
        if arch.mlm is None:
            raise StartupError(f"{spec.architecture} has no masked-LM head for SPLADE")
        rules = arch.mlm
        opts = {
            "act": cfg.get("hidden_act") or cfg.get("activation") or "gelu",
            "eps": cfg.get("layer_norm_eps", 1e-12),
        }
        return MLMHead(hidden, cfg["vocab_size"], **{**opts, **rules.overrides(cfg)}), rules
    return None, None


def _checkpoint(
    spec: ModelSpec, arch: Architecture, rules: HeadRules | None
) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under the served model's names: `encoder.*` and `head.*`; a
    head weight tied to an encoder one (absent from the checkpoint) is that tensor."""
    state = load_state_dict(spec.path)
    strip = tuple((f"^{re.escape(p)}", "") for p in arch.base_prefixes)
    state = remap(state, strip)
    answer = _answer_weight(spec, state) if spec.llm_rerank is not None else None
    renames = list(rules.rules if rules else ())
    renames += [(pattern, None) for pattern in arch.ignore]
    state = remap(state, renames, default_prefix="encoder.")
    for key, source in rules.tied if rules else ():
        if key not in state and source in state:
            state[key] = state[source]
    if answer is not None:
        state["head.out_proj.weight"] = answer
    return state


def _answer_weight(spec: ModelSpec, state: dict[str, torch.Tensor]) -> torch.Tensor:
    """The LLM reranker's one-row head: the LM head rows of the answer tokens, as yes - no.

    softmax over (no, yes) at the last token is sigmoid(logit_yes - logit_no), and that
    difference is one dot product with the difference of the two rows: the vocabulary
    projection is never computed. The LM head is the input embeddings where they are tied.
    """
    llm = spec.llm_rerank
    assert llm is not None
    weight = state.get("lm_head.weight")
    if weight is None:
        weight = state.get("embed_tokens.weight")
    if weight is None:
        raise StartupError(f"{spec.path} has no lm_head.weight nor tied input embeddings")
    row = weight[llm.yes_id].float()
    if llm.no_id is not None:
        row = row - weight[llm.no_id].float()
    return row.unsqueeze(0)


def build_model(spec: ModelSpec, arch: Architecture) -> ServedModel:
    """Build the module tree for `spec` and load its checkpoint strictly."""
    head, rules = build_head(spec, arch)
    model = ServedModel(arch.build_encoder(spec.config), head)
    strict_load(model, _checkpoint(spec, arch, rules), what=f"{spec.architecture} from {spec.path}")
    return model


def cast(model: ServedModel, device: str, dtype: torch.dtype) -> None:
    """`model` in eval mode on `device` in `dtype`, but for its encoder's float32 parts, which
    keep their loaded values."""
    kept = [
        (part, {k: v.clone() for k, v in part.state_dict().items()})
        for part in model.encoder.float32_parts()
    ]
    model.eval().to(device=device, dtype=dtype)
    for part, state in kept:
        part.to(dtype=torch.float32)
        part.load_state_dict(state)


def load_head(spec: ModelSpec) -> nn.Module:
    """The served task's head alone, loaded strictly: for backends that run the encoder
    elsewhere (ONNX Runtime) and the head here."""
    arch = lookup(spec.model_type)
    if arch is None:
        raise StartupError(f"model_type {spec.model_type!r} has no native head in vectorpress")
    head, rules = build_head(spec, arch)
    if head is None or rules is None:
        raise StartupError(f"{spec.architecture}: the served task has no head")
    state = _checkpoint(spec, arch, rules)
    own = {k.removeprefix("head."): v for k, v in state.items() if k.startswith("head.")}
    strict_load(head, own, what=f"the head of {spec.architecture} from {spec.path}")
    return head


def _cpu_kernels(dtype: torch.dtype, cache_dir: Path, int8: bool = False) -> CpuKernels:
    """The compiled ops this dtype's CPU passes call where they fit; an int8 model's attention
    on AVX512-BF16's dot products where the CPU has them (`int8.py`)."""
    if dtype == torch.bfloat16:
        return bf16_kernels(dtype, cache_dir)
    kernels = f32_kernels(dtype, cache_dir)
    rounded = (
        rounded_attention(cache_dir, kernels.attention) if int8 and kernels is not NONE else None
    )
    if rounded is None:
        return kernels
    log.info("int8 passes: attention on AVX512-BF16's dot products, its rows rounded to bfloat16")
    return dataclasses.replace(kernels, attention=rounded)


# fbgemm's int8 GEMM is kept only where it runs an int8 pass this much faster than oneDNN's:
# on the Zen 4 oneDNN's ran it 1.1-1.2x faster and its resident memory stayed flat (426-429 MiB
# at rest over 3,000 batches of 1-64 corpus texts, heap trimmed) where fbgemm's crept (367 ->
# 404 MiB over 1,500), and where the CPU has AMX oneDNN's runs on its int8 tiles; when oneDNN
# had to win by 5%, a start alone and one beside another process's load each picked fbgemm.
INT8_FBGEMM_MARGIN = 0.05


def _threads(n: int) -> str:
    return "1 thread" if n == 1 else "all threads"


class TorchBackend:
    """Runs the native model on the flat tensor of a batch's real tokens."""

    name = "torch"
    is_padded = False
    max_batch_size: int | None = None

    def __init__(
        self,
        spec: ModelSpec,
        device: str = "cpu",
        dtype: str | None = None,
        cache_dir: Path | None = None,
        cuda_graphs: bool = True,
    ) -> None:
        """The signature every backend shares (see `backends.base.Backend`); `cache_dir` keeps
        the encoder's exported ONNX graph, where short CPU passes may run (`short_graph.py`).
        `cuda_graphs`: on a GPU, replay the encoder from CUDA graphs where it can
        (`cuda_graphs.py`)."""
        if dtype == "int8" and device == "cuda":
            raise StartupError("--dtype int8 runs on the CPU only (--device cpu)")
        device = pick_device(device)
        arch = lookup(spec.model_type)
        if arch is None:
            raise StartupError(f"model_type {spec.model_type!r} has no native implementation")
        self.spec = spec
        self.arch = arch
        self.device = device
        # Its CPU passes keep no state between calls but per thread (compiled kernels'
        # scratch, int8's workspace, attention's layout): several runners may call it.
        self.concurrent_passes = device == "cpu"
        self.dtype = dtype or ("float32" if device == "cpu" else arch.gpu_dtype)
        if self.dtype == "float16" and arch.gpu_dtype != "float16":
            log.warning("%s overflows in float16; prefer --dtype bfloat16", spec.model_type)
        int8 = self.dtype == "int8"
        if int8:
            if device != "cpu":
                raise StartupError("--dtype int8 runs on the CPU only (--device cpu)")
            int8_ready()
        torch_dtype = _DTYPES[self.dtype]
        model = build_model(spec, arch)
        cast(model, device, torch_dtype)
        plan = PassPlan(small_onednn=False, large_onednn=False)
        shortcuts: tuple[Shortcut, ...] = ()
        kernels = (
            _cpu_kernels(torch_dtype, cache_dir or build_cache(), int8) if device == "cpu" else NONE
        )
        if int8:
            model.encoder.fuse(False)  # F.linear until quantized below
        elif device == "cpu" and onednn_supported(torch_dtype):
            if short_graph_fits(spec, arch):
                shortcuts = self._shortcuts(
                    spec, model.encoder, torch_dtype, cache_dir or build_cache()
                )
            encoder = model.encoder
            plan = plan_when_quiet(
                lambda: plan_passes(
                    encoder, spec.position_offset, shortcuts=shortcuts, kernels=kernels
                )
            )
            short = "oneDNN" if plan.small_onednn else "F.linear"
            log.info(
                "CPU passes, as timed here: short ones on %s with %s, larger ones on %s with %s",
                plan.small_shortcut or short,
                _threads(plan.small_threads),
                *("oneDNN" if plan.large_onednn else "F.linear", _threads(0)),
            )
        else:
            model.encoder.fuse()
        if isinstance(model.head, MLMHead) and device == "cpu":
            model.head.fuse()
        self.model = model
        # Between layers, a waiting query may run (see backends/preemption.py).
        add_layer_points(model.encoder)
        self.varlen, why = varlen_usable(device, torch_dtype)
        log.info("attention: %s (%s)", "varlen_attn" if self.varlen else "sdpa", why)
        # Graphs need every layer on varlen_attn; a model that is not finds out on its first
        # capture (`cuda_graphs.py`).
        pools = spec.kind == "embedding" and spec.pooling in POOLED_IN_GRAPHS
        self.graphs = (
            CudaGraphs(
                model.encoder, device, spec.max_input_length, spec.pooling if pools else None
            )
            if cuda_graphs and self.varlen
            else None
        )
        if cuda_graphs and device != "cpu":
            log.info("CUDA graphs: %s", "on" if self.graphs else f"off ({why})")
        self.dense = [
            load_dense(d).eval().to(device=device, dtype=torch.float32) for d in spec.dense
        ]
        self.multi = MultiVectorHeads(spec, device)
        shortcut = next((c.run for c in shortcuts if c.name == plan.small_shortcut), None)
        self.passes = CpuPasses(
            INT8_PASS_TOKENS if int8 else CPU_PASS_TOKENS,
            plan,
            shortcut=shortcut,
            kernels=kernels,
        )
        if int8:
            lib = load_library(cache_dir or build_cache())
            self._quantize(lib)
            kernel = int8_kernel_candidate(lib, model.encoder, kernels)
            self.passes = self._plan_int8(kernels, kernel)

    @staticmethod
    def _shortcuts(
        spec: ModelSpec, encoder: FusedModel, dtype: torch.dtype, cache_dir: Path
    ) -> tuple[Shortcut, ...]:
        """The other way short passes may run, for start-up to time: the compiled kernel
        (`short_kernel.py`) where it builds, else, in float32 (the graph's dtype), the
        encoder's ONNX graph (`short_graph.py`). Either keeps a second copy of the weights:
        base-sized encoders at most.

        Not both, measured on the AMX Xeon: the kernel ran all-MiniLM-L6-v2's 16-token query
        in 2.00 ms against the graph's 2.46 (five alternated blocks) and all-mpnet-base-v2's
        in 18.5 against 19.4 (oneDNN 25.5; three alternated blocks: its 340 MB of weights
        come from memory either way), while the graph's export and fusion took a first start
        to Ready in 10.1 s (MiniLM) and 18.1 s at a 3.0 GB peak (mpnet) against 2.6 s and
        6.0 s at 1.6 GB without it; and MiniLM's first starts, timed right after the export
        and fusion, kept the graph where every later start, on the cached graph, kept the
        kernel."""
        parameters = sum(p.numel() for p in encoder.parameters())
        if parameters > MAX_PARAMETERS:
            return ()
        kernel = kernel_candidate(encoder, dtype, cache_dir)
        if kernel is not None:
            return (Shortcut(KERNEL, kernel, (0, 1)),)
        if dtype != torch.float32:
            return ()
        graph = graph_candidate(spec, parameters, cache_dir)
        return () if graph is None else (Shortcut(GRAPH, graph, (1,)),)

    def _quantize(self, lib: ctypes.CDLL | None) -> None:
        """Calibrate on the packaged texts through this backend's own passes, then quantize
        (each layer's input rows scaled on the compiled kernel's library where it built)."""
        batch = calibration_batch(self.spec)
        rows = compiled_rows(lib)
        worst = quantize_linears(self.model.encoder, lambda: self._encode(batch), rows=rows)
        log.info(
            "int8: linear layers quantized; lowest cosine to float32 over %d calibration texts "
            "(mean of the last hidden states): %.4f",
            batch.size,
            worst,
        )

    def _plan_int8(self, kernels: CpuKernels, kernel: Int8Kernel | None) -> CpuPasses:
        """Every int8 pass on oneDNN's GEMM unless fbgemm's ran the larger pass faster here by
        INT8_FBGEMM_MARGIN, the other's weights freed; short passes on the thread count that
        ran them faster, or on `kernel` (`int8_kernel.py`) where it ran them faster, the passes
        are on oneDNN's GEMM and it gives a probe pass's values to the bit; larger passes on
        `kernel` too where it also ran the larger pass faster (oneDNN's GEMM then kept whatever
        fbgemm's timing, for the passes the kernel cannot run, ColBERT's queries). One GEMM's
        values for all: a text's vector then does not depend on its pass."""
        encoder = self.model.encoder
        # The GEMMs part most on passes of the size int8 runs (at 256 tokens the pass's other
        # work hid their gap in timing noise).
        larger = (64,) * (INT8_PASS_TOKENS // 64)
        shortcuts = () if kernel is None else (Shortcut(KERNEL, kernel, (0, 1), larger=True),)
        timed = plan_when_quiet(
            lambda: plan_passes(
                encoder,
                self.spec.position_offset,
                shortcuts=shortcuts,
                kernels=kernels,
                fuse=False,
                larger=larger,
                repeats=5,
                budget=1.0,
                margin=-INT8_FBGEMM_MARGIN,
            )
        )
        onednn = (timed.large_onednn or timed.large_shortcut) and all(
            "oneDNN" in linear.int8.kernels
            for linear in fused_linears(encoder)
            if linear.int8 is not None
        )
        plan = PassPlan(onednn, onednn, timed.small_threads)
        passes = CpuPasses(INT8_PASS_TOKENS, plan, kernels=kernels)
        if kernel is not None and onednn and timed.small_shortcut:
            with_kernel = CpuPasses(
                INT8_PASS_TOKENS,
                dataclasses.replace(
                    plan,
                    small_shortcut=timed.small_shortcut,
                    large_shortcut=timed.large_shortcut,
                ),
                shortcut=kernel,
                kernels=kernels,
            )
            if self._same_short_pass(passes, with_kernel):
                passes = with_kernel
            else:
                log.warning(
                    "int8: the pass kernel's values differ from oneDNN's passes here: "
                    "the passes stay on oneDNN's GEMM"
                )
        keep_int8_gemm(encoder, onednn)
        gemm = "oneDNN" if onednn else "fbgemm"
        if passes.shortcut is None:
            short = f"with {_threads(plan.small_threads)}"
            log.info("int8 passes, as timed here: on %s's GEMM; short ones %s", gemm, short)
        elif passes.plan.large_shortcut:
            log.info("int8 passes, as timed here: every one on %s", KERNEL)
        else:
            log.info("int8 passes, as timed here: on %s's GEMM; short ones on %s", gemm, KERNEL)
        return passes

    def _same_short_pass(self, native: CpuPasses, shortcut: CpuPasses) -> bool:
        """Whether a short pass of two texts gives the same values to the bit on both."""
        lengths = [13, 6]
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(1000, 2000, (sum(lengths),), generator=generator)
        types = torch.zeros_like(ids)
        positions = torch.cat([torch.arange(n) for n in lengths]) + self.spec.position_offset
        seqs = PackedSequences(torch.tensor([0, lengths[0], sum(lengths)]), max(lengths))
        with torch.inference_mode():
            want = native.run(self.model.encoder, ids, types, positions, seqs)
            got = shortcut.run(self.model.encoder, ids, types, positions, seqs)
        return torch.equal(want, got)

    def _sequences(self, batch: Batch) -> PackedSequences:
        """The batch's bounds, read on the host (no wait for the device); `_on_device` moves
        them to the device."""
        keys = None if batch.key_lengths is None else batch.key_lengths.tolist()
        return PackedSequences(
            torch.from_numpy(batch.cu_seqlens), batch.max_seqlen, self.varlen, keys
        )

    def _replay(self, batch: Batch, seqs: PackedSequences) -> Replayed | None:
        if self.graphs is None or not seqs.varlen:
            return None
        return self.graphs(batch.input_ids, batch.token_type_ids, batch.position_ids, seqs.lengths)

    def _encode(
        self, batch: Batch, seqs: PackedSequences | None = None
    ) -> tuple[torch.Tensor, PackedSequences]:
        seqs = self._sequences(batch) if seqs is None else seqs
        if self.device == "cpu":
            ids, types, positions = (
                torch.from_numpy(a)
                for a in (batch.input_ids, batch.token_type_ids, batch.position_ids)
            )
            return self.passes.run(self.model.encoder, ids, types, positions, seqs), seqs
        return self._on_device(batch, seqs, self._replay(batch, seqs))

    def _on_device(
        self, batch: Batch, seqs: PackedSequences, replayed: Replayed | None
    ) -> tuple[torch.Tensor, PackedSequences]:
        """The batch's hidden states on the GPU: the replayed graph's, or an eager pass's."""
        dev = self.device
        seqs.cu_seqlens = seqs.cu_seqlens.to(dev)
        if replayed is not None:
            return replayed.hidden, seqs
        ids, types, positions = (
            torch.from_numpy(a).to(dev)
            for a in (batch.input_ids, batch.token_type_ids, batch.position_ids)
        )
        return self.model.encoder(ids, types, positions, seqs), seqs

    def embed(self, batch: Batch) -> BatchOutput:
        pooled = self._pooled_on_kernel(batch)
        if pooled is not None:
            return BatchOutput(pooled, [])
        return self._embed(batch)

    def _pooled_on_kernel(self, batch: Batch) -> np.ndarray | None:
        """The vectors of a batch that the compiled kernel runs in one short pass, every text
        pooled by its first token or its mean with no dense layer after, straight from the
        batch's arrays (`ShortKernel.pooled`); None where the batch takes the general path."""
        kernel = self.passes.shortcut
        tokens = len(batch.input_ids)
        if (
            not isinstance(kernel, ShortKernel)
            or tokens >= SMALL_PASS_TOKENS
            or self.spec.pooling not in ("mean", "cls")
            or self.dense
            or batch.raw_indices
            or batch.multi_indices
            or batch.key_lengths is not None
        ):
            return None
        return kernel.pooled(
            batch.input_ids,
            batch.token_type_ids,
            batch.position_ids,
            batch.cu_seqlens,
            batch.max_seqlen,
            self.spec.pooling == "cls",
            self.passes.threads(tokens),
        )

    @torch.inference_mode()
    def _embed(self, batch: Batch) -> BatchOutput:
        which = list(batch.pooled_indices)
        seqs = self._sequences(batch)
        if self.device == "cpu":
            hidden, seqs = self._encode(batch, seqs)
        else:
            replayed = self._replay(batch, seqs)
            if replayed is not None and replayed.pooled is not None and len(which) == seqs.size:
                # Every sequence pooled (no per-token outputs): the graph pooled them itself.
                vectors = replayed.pooled.float()
                for dense in self.dense:
                    vectors = dense(vectors)
                return BatchOutput(vectors.cpu().numpy(), [])
            hidden, seqs = self._on_device(batch, seqs, replayed)
        pooled: np.ndarray | None = None
        if which:
            if self.spec.is_splade:
                assert isinstance(self.model.head, MLMHead)
                vectors = splade_vectors(self.model.head, hidden, seqs, which)
            else:
                assert self.spec.pooling is not None
                # On the pass's own thread count: a short pass planned on one thread would
                # otherwise wake the second for each parallel op here, a wait of a time slice
                # when other work holds that core.
                with num_threads(self.passes.threads(seqs.total)):
                    vectors = pool(hidden, seqs, self.spec.pooling, which).float()
                    for dense in self.dense:
                        vectors = dense(vectors)
            pooled = vectors.float().cpu().numpy()
        raw = [
            hidden[seqs.starts[i] : seqs.starts[i] + seqs.lengths[i]].float().cpu().numpy()
            for i in batch.raw_indices
        ]
        return BatchOutput(pooled, raw, self.multi.outputs(batch, hidden, seqs))

    @torch.inference_mode()
    def predict(self, batch: Batch) -> BatchOutput:
        hidden, seqs = self._encode(batch)
        assert self.model.head is not None
        which = list(batch.pooled_indices)
        pad = self.spec.config.get("pad_token_id")
        if self.spec.llm_rerank is not None:
            # The answer comes after the prompt's very last token, whatever its id.
            pooled = pool(hidden, seqs, "last_token", which)
        elif self.classifier_pooling == "last_token" and pad is not None:
            pooled = hidden[last_non_pad_rows(batch.input_ids, seqs, which, int(pad))]
        else:
            pooled = pool(hidden, seqs, self.classifier_pooling, which)
        logits = self.model.head(pooled)
        return BatchOutput(logits.float().cpu().numpy(), [])

    @property
    def classifier_pooling(self) -> str:
        # Most heads read the first token, decoders the last; ModernBERT's config may ask for mean.
        return str(self.spec.config.get("classifier_pooling", self.arch.classifier_pooling))

    def health(self) -> None:
        return None
