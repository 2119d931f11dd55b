"""ModernBERT: a pre-LayerNorm encoder with rotary positions, local and global attention layers.

What is special:
- no position or token-type embeddings: tok_embeddings -> LayerNorm only;
- LayerNorms and linear layers without biases by default (`norm_bias`, `attention_bias`,
  `mlp_bias`); the first layer has no attention norm (the embedding norm stands in for it);
- every `global_attn_every_n_layers`-th layer attends globally with rotary base
  `global_rope_theta` (160k); the others attend within `local_attention` tokens (half on each
  side) with base `local_rope_theta` (10k);
- a fused Wqkv projection and a GeGLU MLP (`Wi` gives input and gate halves);
- a final LayerNorm.

Its classifier reads the first token or the mean of all (`classifier_pooling`), through
dense -> activation -> LayerNorm -> classifier.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vectorpress.backends.common.activations import activation
from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.torch.attention import packed_attention
from vectorpress.backends.torch.blocks import Fusable, FusedGatedMLP, FusedModel, built
from vectorpress.backends.torch.layers import FusedLinear
from vectorpress.backends.torch.rotary import Rotary, rope_theta, rotate

_SLIDING = "sliding_attention"


def _layer_types(cfg: dict[str, Any]) -> list[str]:
    types = cfg.get("layer_types")
    if types:
        return list(types)
    every = int(cfg.get("global_attn_every_n_layers", 3))
    return [_SLIDING if i % every else "full_attention" for i in range(cfg["num_hidden_layers"])]


def _norm(cfg: dict[str, Any]) -> nn.LayerNorm:
    return nn.LayerNorm(
        cfg["hidden_size"], eps=cfg.get("norm_eps", 1e-5), bias=cfg.get("norm_bias", False)
    )


class ModernBertEmbeddings(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.norm = _norm(cfg)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.norm(self.tok_embeddings(input_ids))
        return out


class ModernBertAttention(Fusable):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        hidden = cfg["hidden_size"]
        bias = cfg.get("attention_bias", False)
        self.heads = cfg["num_attention_heads"]
        self.Wqkv = nn.Linear(hidden, 3 * hidden, bias=bias)
        self.Wo = nn.Linear(hidden, hidden, bias=bias)
        self.fused: tuple[FusedLinear, FusedLinear] | None = None

    def fuse(self, fast: bool = True) -> None:
        self.fused = FusedLinear.of(self.Wqkv, fast=fast), FusedLinear.of(self.Wo, fast=fast)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        seqs: PackedSequences,
        window: int | None,
    ) -> torch.Tensor:
        total, hidden = x.shape
        wqkv, wo = built(self.fused)
        qkv = wqkv(x).view(total, 3, self.heads, hidden // self.heads)
        q, k, v = qkv.unbind(1)
        cos, sin = rope
        # transformers rotates in float32 and casts back; in float32 this is the same.
        q, k = (
            rotate(q.float(), cos.float(), sin.float()),
            rotate(k.float(), cos.float(), sin.float()),
        )
        q, k = q.to(v.dtype), k.to(v.dtype)
        out = packed_attention(q, k, v, seqs, window=window)
        return wo(out.reshape(total, hidden))


class ModernBertMLP(Fusable):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        hidden, inter = cfg["hidden_size"], int(cfg["intermediate_size"])
        bias = cfg.get("mlp_bias", False)
        self.Wi = nn.Linear(hidden, 2 * inter, bias=bias)
        self.Wo = nn.Linear(inter, hidden, bias=bias)
        self.act = activation(cfg.get("hidden_activation", "gelu"))
        self.fused: FusedGatedMLP | None = None

    def fuse(self, fast: bool = True) -> None:
        # Wi is already one GEMM, input half first: the act(first) * second shape of FusedGatedMLP.
        self.fused = FusedGatedMLP(
            FusedLinear.of(self.Wi, fast=fast), FusedLinear.of(self.Wo, fast=fast), self.act
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return built(self.fused)(x)


class ModernBertEncoderLayer(nn.Module):
    def __init__(self, cfg: dict[str, Any], first: bool) -> None:
        super().__init__()
        self.attn_norm = nn.Identity() if first else _norm(cfg)
        self.attn = ModernBertAttention(cfg)
        self.mlp_norm = _norm(cfg)
        self.mlp = ModernBertMLP(cfg)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        seqs: PackedSequences,
        window: int | None,
    ) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope, seqs, window)
        out: torch.Tensor = x + self.mlp(self.mlp_norm(x))
        return out


class ModernBertModel(FusedModel):
    """Returns the final-normed hidden state of every real token, `(total_tokens, hidden)`."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        n = cfg["num_hidden_layers"]
        self.embeddings = ModernBertEmbeddings(cfg)
        self.layers = nn.ModuleList(ModernBertEncoderLayer(cfg, i == 0) for i in range(n))
        self.final_norm = _norm(cfg)
        self.types = _layer_types(cfg)
        head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
        self.rotary_global = Rotary(
            head_dim, rope_theta(cfg, "full_attention", "global_rope_theta", 160_000.0)
        )
        self.rotary_local = Rotary(
            head_dim, rope_theta(cfg, _SLIDING, "local_rope_theta", 10_000.0)
        )
        # `local_attention` is the whole window; packed_attention keeps |distance| <= window // 2.
        self.window = int(cfg.get("local_attention", 128))

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        position_ids: torch.Tensor,
        seqs: PackedSequences,
    ) -> torch.Tensor:
        x = self.embeddings(input_ids)
        local = self.rotary_local(position_ids, x.dtype)
        full = self.rotary_global(position_ids, x.dtype)
        for layer, kind in zip(self.layers, self.types, strict=True):
            if kind == _SLIDING:
                x = layer(x, local, seqs, self.window)
            else:
                x = layer(x, full, seqs, None)
        out: torch.Tensor = self.final_norm(x)
        return out
