"""Qwen2, and the Llama-style decoder layout that Qwen3, Mistral and Llama share with it.

Pre-RMSNorm decoder layers, rotary positions, grouped-query attention (k/v with fewer heads than
q), a SiLU-gated MLP, a final RMSNorm. Served as an embedder the attention stays causal, as in
training, so the last token (`last_token` pooling) is the only one that has seen the whole input.
What differs between the three:

- Qwen2: biases on q/k/v (not on o);
- Qwen3: no biases, RMSNorm on each head of q and k before the rotation, an explicit head_dim;
- Mistral: no biases, a sliding window on every layer;
- Llama: biases everywhere or nowhere (`attention_bias`, `mlp_bias`), no window.

Windows are causal: a token sees itself and the `sliding_window - 1` tokens before it.
"""

from __future__ import annotations

from typing import Any, NamedTuple, cast

import torch
from torch import nn
from torch.nn import functional as F

from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.torch.attention import packed_attention
from vectorpress.backends.torch.blocks import FusedGatedMLP, FusedQKVO
from vectorpress.backends.torch.rotary import RMSNorm, Rotary, rope_scale, rope_theta, rotate


def causal_window(sliding_window: int | None) -> int | None:
    """transformers' causal window W (distance < W) as packed_attention's symmetric window."""
    return None if sliding_window is None else 2 * (int(sliding_window) - 1)


class Biases(NamedTuple):
    qkv: bool = False
    o: bool = False
    mlp: bool = False


class DecoderAttention(nn.Module):
    def __init__(self, cfg: dict[str, Any], biases: Biases, qk_norm: bool) -> None:
        super().__init__()
        hidden = cfg["hidden_size"]
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg.get("num_key_value_heads") or self.heads
        self.head_dim = cfg.get("head_dim") or hidden // self.heads
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=biases.qkv)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=biases.qkv)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=biases.qkv)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=biases.o)
        eps = cfg.get("rms_norm_eps", 1e-6)
        self.q_norm = RMSNorm(self.head_dim, eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, eps) if qk_norm else None
        self.fused: FusedQKVO | None = None

    def fuse(self, fast: bool = True) -> None:
        self.fused = FusedQKVO.of(self.q_proj, self.k_proj, self.v_proj, self.o_proj, fast)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        seqs: PackedSequences,
        window: int | None,
    ) -> torch.Tensor:
        total = x.shape[0]
        fused = self.fused
        if fused is None:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        else:
            q, k, v = fused.project(x)
        q = q.view(total, self.heads, self.head_dim)
        k = k.view(total, self.kv_heads, self.head_dim)
        v = v.view(total, self.kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rope
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        out = packed_attention(q, k, v, seqs, causal=True, window=window)
        out = out.reshape(total, self.heads * self.head_dim)
        return self.o_proj(out) if fused is None else fused.o(out)


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)
        self.fused: FusedGatedMLP | None = None

    def fuse(self, fast: bool = True) -> None:
        self.fused = FusedGatedMLP.of(self.gate_proj, self.up_proj, self.down_proj, "silu", fast)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused is not None:
            return self.fused(x)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: dict[str, Any], biases: Biases, qk_norm: bool) -> None:
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.self_attn = DecoderAttention(cfg, biases, qk_norm)
        self.mlp = GatedMLP(hidden, cfg["intermediate_size"], biases.mlp)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        seqs: PackedSequences,
        window: int | None,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, seqs, window)
        return x + self.mlp(self.post_attention_layernorm(x))


def layer_windows(cfg: dict[str, Any]) -> list[int | None]:
    """Each layer's window: from `layer_types` when the config lists them (transformers 5),
    else Qwen2's `use_sliding_window` / `max_window_layers` rule."""
    n = cfg["num_hidden_layers"]
    window = causal_window(cfg.get("sliding_window"))
    types = cfg.get("layer_types")
    if types:
        return [window if t == "sliding_attention" else None for t in types]
    if not cfg.get("use_sliding_window") or window is None:
        return [None] * n
    first = int(cfg.get("max_window_layers", n))
    return [window if i >= first else None for i in range(n)]


class DecoderModel(nn.Module):
    """Returns the final-normed hidden state of every real token, `(total_tokens, hidden)`."""

    qk_norm = False

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        hidden = cfg["hidden_size"]
        biases = self.biases(cfg)
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], hidden)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, biases, self.qk_norm) for _ in range(cfg["num_hidden_layers"])
        )
        self.norm = RMSNorm(hidden, cfg.get("rms_norm_eps", 1e-6))
        head_dim = cfg.get("head_dim") or hidden // cfg["num_attention_heads"]
        self.rotary = Rotary(
            head_dim, rope_theta(cfg, None, "rope_theta", 10000.0), rope_scale(cfg, None)
        )
        self.windows = self.layer_windows(cfg)

    def fuse(self, fast: bool = True) -> None:
        """Prepare the GEMMs once the weights are final; `fast=False` keeps F.linear
        everywhere: the reference the fast path is tested on."""
        for layer in self.layers:
            layer = cast(DecoderLayer, layer)
            layer.self_attn.fuse(fast)
            layer.mlp.fuse(fast)

    def layer_windows(self, cfg: dict[str, Any]) -> list[int | None]:
        return layer_windows(cfg)

    def biases(self, cfg: dict[str, Any]) -> Biases:
        return Biases()

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        position_ids: torch.Tensor,
        seqs: PackedSequences,
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        rope = self.rotary(position_ids, x.dtype)
        for layer, window in zip(self.layers, self.windows, strict=True):
            x = layer(x, rope, seqs, window)
        return self.norm(x)


class Qwen2Model(DecoderModel):
    def biases(self, cfg: dict[str, Any]) -> Biases:
        return Biases(qkv=True)
