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

from typing import Any, NamedTuple

import torch
from torch import nn

from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.torch.blocks import DecoderAttention, FusedModel, GatedMLP
from vectorpress.backends.torch.rotary import RMSNorm, Rotary, rope_scale, rope_theta


def causal_window(sliding_window: int | None) -> int | None:
    """transformers' causal window W (distance < W) as packed_attention's symmetric window."""
    return None if sliding_window is None else 2 * (int(sliding_window) - 1)


class Biases(NamedTuple):
    qkv: bool = False
    o: bool = False
    mlp: bool = False


class DecoderLayer(nn.Module):
    def __init__(self, cfg: dict[str, Any], biases: Biases, qk_norm: bool) -> None:
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        heads = cfg["num_attention_heads"]
        self.self_attn = DecoderAttention(
            hidden,
            heads,
            cfg.get("num_key_value_heads") or heads,
            cfg.get("head_dim") or hidden // heads,
            qkv_bias=biases.qkv,
            o_bias=biases.o,
            qk_norm=(eps, 0.0) if qk_norm else None,
        )
        # Every checkpoint of these families gates with SiLU (their configs' hidden_act).
        self.mlp = GatedMLP(hidden, cfg["intermediate_size"], "silu", biases.mlp)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        seqs: PackedSequences,
        window: int | None,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, seqs, True, window)
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


class DecoderModel(FusedModel):
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
