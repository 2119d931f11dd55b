"""Fused GEMM groups that several model files share, built on FusedLinear.

Each is built by a model's `fuse()` once the weights are final, and kept in a plain attribute
(not a submodule): it holds derived copies of weights that the state dict owns under the
model's own names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from vectorpress.backends import preemption
from vectorpress.backends.common.activations import Activation, activation
from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.torch.attention import packed_attention
from vectorpress.backends.torch.layers import FusedLinear


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
    def of(
        cls,
        heads: int,
        qkv: tuple[nn.Linear, nn.Linear, nn.Linear],
        attn_out: nn.Linear,
        ffn: tuple[nn.Linear, nn.Linear],
        act: str,
        fast: bool = True,
    ) -> FusedPostNormLayer:
        return cls(
            heads,
            merged(*qkv, fast=fast),
            FusedLinear.of(attn_out, fast=fast),
            FusedLinear.of(ffn[0], act, fast=fast),
            FusedLinear.of(ffn[1], fast=fast),
        )

    def __call__(
        self,
        x: torch.Tensor,
        seqs: PackedSequences,
        attn_norm: nn.Module,
        ffn_norm: nn.Module,
        bias: Callable[[int], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        total, hidden = x.shape
        qkv = self.qkv(x).view(total, 3, self.heads, hidden // self.heads)
        q, k, v = qkv.unbind(1)
        ctx = packed_attention(q, k, v, seqs, bias=bias).reshape(total, hidden)
        x = attn_norm(self.attn_out(ctx).add_(x))
        # The feed-forward half is about 60% of a layer's work: a second place to switch.
        preemption.point()
        out: torch.Tensor = ffn_norm(self.ffn_out(self.ffn_in(x)).add_(x))
        return out


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
