"""What several model files share: fused GEMM groups on FusedLinear, the decoder attention and
gated MLP, and the `fuse()` that prepares a whole model.

A model file's modules hold the weights under the Hugging Face state dict's names; their forward
runs only the fused GEMMs that `fuse()` builds from those weights once they are final (loaded,
on their device and dtype). A fused group lives in a plain attribute (not a submodule): it holds
derived copies of weights that the state dict owns. `fuse(fast=False)` builds the same groups on
F.linear: the portable path, and the reference the oneDNN path is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

from vectorpress.backends import preemption
from vectorpress.backends.common.activations import Activation, activation
from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.torch.attention import ScoreBias, packed_attention
from vectorpress.backends.torch.cpu_kernels import add_norm
from vectorpress.backends.torch.layers import FusedLinear
from vectorpress.backends.torch.rotary import RMSNorm, rotate

T = TypeVar("T")


def built(fused: T | None) -> T:
    """A module's fused GEMMs; a forward before `fuse()` is a programming error, said plainly."""
    if fused is None:
        raise RuntimeError(
            "call fuse() on the model once its weights are loaded, before running it"
        )
    return fused


class Fusable(nn.Module):
    """A module whose forward runs GEMMs that `fuse()` builds from its weights."""

    def fuse(self, fast: bool = True) -> None:
        raise NotImplementedError


class FusedModel(nn.Module):
    """A model file's top module: `fuse()` prepares every Fusable module in it."""

    def fuse(self, fast: bool = True) -> None:
        """Build every fused GEMM group once the weights are final; `fast=False` keeps F.linear
        everywhere (the portable path, and the reference of the oneDNN one)."""
        for module in self.modules():
            if isinstance(module, Fusable):
                module.fuse(fast)

    def float32_parts(self) -> list[nn.Module]:
        """Modules whose weights are only ever read into float32 work, whatever the model's
        dtype: the backend's cast leaves them in float32 (rounding them would lose accuracy and
        save nothing)."""
        return []


def merged(*linears: nn.Linear, act: str | None = None, fast: bool = True) -> FusedLinear:
    """Several projections of the same input as one GEMM, their outputs side by side."""
    weight = torch.cat([lin.weight for lin in linears])
    biases = [lin.bias for lin in linears]
    bias: torch.Tensor | None = None
    if any(b is not None for b in biases):
        bias = torch.cat(
            [
                b if b is not None else lin.weight.new_zeros(lin.out_features)
                for lin, b in zip(linears, biases, strict=True)
            ]
        )
    return FusedLinear(weight, bias, act, fast=fast)


@dataclass(frozen=True)
class PostNormParts:
    """The modules of a post-LayerNorm encoder layer (BERT, DistilBERT, MPNet) under their
    state dict's names: what its fused GEMMs and the short-pass kernel (`short_kernel.py`) are
    built from."""

    heads: int
    qkv: tuple[nn.Linear, nn.Linear, nn.Linear]
    attn_out: nn.Linear
    ffn: tuple[nn.Linear, nn.Linear]
    act: str
    attn_norm: nn.LayerNorm
    ffn_norm: nn.LayerNorm


@dataclass(frozen=True)
class EmbeddingSum:
    """A post-LayerNorm encoder's embeddings as the sum of table rows, in the order its module
    adds them, then a LayerNorm: each table with the input it is read by (0 input ids, 1 token
    type ids, 2 position ids; None: row 0 for every token). What the short-pass kernel runs
    them from (`short_kernel.py`)."""

    tables: tuple[tuple[nn.Embedding, int | None], ...]
    norm: nn.LayerNorm


@dataclass
class FusedPostNormLayer:
    """The GEMMs of a post-LayerNorm encoder layer (DistilBERT, MPNet): Q, K and V as one
    projection, the FFN activation fused into its GEMM."""

    heads: int
    qkv: FusedLinear
    attn_out: FusedLinear
    ffn_in: FusedLinear
    ffn_out: FusedLinear

    @classmethod
    def of(cls, parts: PostNormParts, fast: bool = True) -> FusedPostNormLayer:
        return cls(
            parts.heads,
            merged(*parts.qkv, fast=fast),
            FusedLinear.of(parts.attn_out, fast=fast),
            FusedLinear.of(parts.ffn[0], parts.act, fast=fast),
            FusedLinear.of(parts.ffn[1], fast=fast),
        )

    def __call__(
        self,
        x: torch.Tensor,
        seqs: PackedSequences,
        attn_norm: nn.Module,
        ffn_norm: nn.Module,
        bias: ScoreBias | None = None,
    ) -> torch.Tensor:
        total, hidden = x.shape
        qkv = self.qkv(x).view(total, 3, self.heads, hidden // self.heads)
        q, k, v = qkv.unbind(1)
        ctx = packed_attention(q, k, v, seqs, bias=bias).reshape(total, hidden)
        x = add_norm(self.attn_out(ctx), x, attn_norm)
        # The feed-forward half is about 60% of a layer's work: a second place to switch.
        preemption.point()
        return add_norm(self.ffn_out(self.ffn_in(x)), x, ffn_norm)


@dataclass
class FusedQKVO:
    """Attention projections that share an input: Q, K and V (any head counts) as one GEMM."""

    qkv: FusedLinear
    o: FusedLinear
    sizes: tuple[int, int, int]

    @classmethod
    def of(
        cls, q: nn.Linear, k: nn.Linear, v: nn.Linear, o: nn.Linear, fast: bool = True
    ) -> FusedQKVO:
        sizes = (q.out_features, k.out_features, v.out_features)
        return cls(merged(q, k, v, fast=fast), FusedLinear.of(o, fast=fast), sizes)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = self.qkv(x).split(self.sizes, dim=-1)
        return q, k, v


@dataclass
class FusedGatedMLP:
    """`down(act(gate) * up)` with gate and up as one GEMM whose output holds gate first.

    The activation stays outside the GEMM: it applies to the gate half only.
    """

    gate_up: FusedLinear
    down: FusedLinear
    act: Activation

    @classmethod
    def of(
        cls, gate: nn.Linear, up: nn.Linear, down: nn.Linear, act: str, fast: bool = True
    ) -> FusedGatedMLP:
        return cls(merged(gate, up, fast=fast), FusedLinear.of(down, fast=fast), activation(act))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(self.act(gate).mul_(up))


class DecoderAttention(Fusable):
    """A decoder's attention (Llama-style: Qwen2/3, Mistral, Llama; Gemma3), on packed tokens.

    Grouped-query: k and v may have fewer heads than q. Optional RMSNorm on each head of q and
    k before the rotation (Qwen3, Gemma3); the score scale is head_dim ** -0.5 unless given
    (Gemma3's query_pre_attn_scalar).
    """

    def __init__(
        self,
        hidden: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        *,
        qkv_bias: bool = False,
        o_bias: bool = False,
        qk_norm: tuple[float, float] | None = None,
        scale: float | None = None,
    ) -> None:
        """`qk_norm`: the per-head RMSNorm's (eps, offset), or None for none."""
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.scale = heads, kv_heads, head_dim, scale
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=o_bias)
        norm = (lambda: RMSNorm(head_dim, *qk_norm)) if qk_norm is not None else None
        self.q_norm = norm() if norm is not None else None
        self.k_norm = norm() if norm is not None else None
        self.fused: FusedQKVO | None = None

    def fuse(self, fast: bool = True) -> None:
        self.fused = FusedQKVO.of(self.q_proj, self.k_proj, self.v_proj, self.o_proj, fast)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        seqs: PackedSequences,
        causal: bool,
        window: int | None,
    ) -> torch.Tensor:
        total = x.shape[0]
        fused = built(self.fused)
        q, k, v = fused.project(x)
        q = q.view(total, self.heads, self.head_dim)
        k = k.view(total, self.kv_heads, self.head_dim)
        v = v.view(total, self.kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rope
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        out = packed_attention(q, k, v, seqs, causal=causal, window=window, scale=self.scale)
        return fused.o(out.reshape(total, self.heads * self.head_dim))


class GatedMLP(Fusable):
    """`down_proj(act(gate_proj(x)) * up_proj(x))`: SiLU for Llama-style decoders, tanh-GeLU
    for Gemma3."""

    def __init__(self, hidden: int, intermediate: int, act: str, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)
        self.act_name = act
        self.fused: FusedGatedMLP | None = None

    def fuse(self, fast: bool = True) -> None:
        self.fused = FusedGatedMLP.of(
            self.gate_proj, self.up_proj, self.down_proj, self.act_name, fast
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return built(self.fused)(x)
