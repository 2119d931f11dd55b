"""Gemma3 text (EmbeddingGemma): a Gemma3 decoder stack run as a bidirectional encoder.

What is special:
- token embeddings are scaled by sqrt(hidden), the scale rounded to the weights' dtype first;
- RMSNorm in Gemma's `(1 + w)` form, also on each head of q and k, and four norms per layer
  ("sandwich": after attention and after the MLP too, before each residual add);
- attention scaled by `query_pre_attn_scalar ** -0.5`, not head_dim's;
- local layers (`sliding_attention`) use their own rotary base (`rope_local_base_freq`) and a
  window, global layers the main base with optional linear scaling;
- with `use_bidirectional_attention` (EmbeddingGemma) no layer is causal and the window is
  symmetric: a token sees the tokens at distance <= sliding_window // 2 on both sides;
- a tanh-GeLU gated MLP.

EmbeddingGemma's Dense projections (768 -> 3072 -> 768) are sentence-transformers modules,
applied after pooling like any other Dense.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.torch.blocks import DecoderAttention, FusedModel, GatedMLP
from vectorpress.backends.torch.rotary import RMSNorm, Rotary, rope_scale, rope_theta

_SLIDING = "sliding_attention"


def _layer_types(cfg: dict[str, Any]) -> list[str]:
    types = cfg.get("layer_types")
    if types:
        return list(types)
    # Older configs: every `sliding_window_pattern`-th layer is global.
    pattern = int(cfg.get("sliding_window_pattern", 6))
    n = cfg["num_hidden_layers"]
    return [_SLIDING if (i + 1) % pattern else "full_attention" for i in range(n)]


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or hidden // heads
        bias = bool(cfg.get("attention_bias", False))
        self.self_attn = DecoderAttention(
            hidden,
            heads,
            cfg.get("num_key_value_heads") or heads,
            head_dim,
            qkv_bias=bias,
            o_bias=bias,
            qk_norm=(eps, 1.0),
            # Scores scaled by query_pre_attn_scalar ** -0.5, as Gemma was trained.
            scale=float(cfg.get("query_pre_attn_scalar") or head_dim) ** -0.5,
        )
        act = cfg.get("hidden_activation") or "gelu_pytorch_tanh"
        self.mlp = GatedMLP(hidden, cfg["intermediate_size"], act)
        self.input_layernorm = RMSNorm(hidden, eps, offset=1.0)
        self.post_attention_layernorm = RMSNorm(hidden, eps, offset=1.0)
        self.pre_feedforward_layernorm = RMSNorm(hidden, eps, offset=1.0)
        self.post_feedforward_layernorm = RMSNorm(hidden, eps, offset=1.0)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        seqs: PackedSequences,
        causal: bool,
        window: int | None,
    ) -> torch.Tensor:
        h = self.self_attn(self.input_layernorm(x), rope, seqs, causal, window)
        x = x + self.post_attention_layernorm(h)
        h = self.mlp(self.pre_feedforward_layernorm(x))
        return x + self.post_feedforward_layernorm(h)


class Gemma3TextModel(FusedModel):
    """Returns the final-normed hidden state of every real token, `(total_tokens, hidden)`."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        hidden = cfg["hidden_size"]
        n = cfg["num_hidden_layers"]
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], hidden)
        self.embed_scale = float(hidden) ** 0.5
        self.layers = nn.ModuleList(Gemma3DecoderLayer(cfg) for _ in range(n))
        self.norm = RMSNorm(hidden, cfg.get("rms_norm_eps", 1e-6), offset=1.0)
        self.causal = not cfg.get("use_bidirectional_attention", False)
        self.types = _layer_types(cfg)
        head_dim = cfg.get("head_dim") or hidden // cfg["num_attention_heads"]
        self.rotary_global = Rotary(
            head_dim,
            rope_theta(cfg, "full_attention", "rope_theta", 1_000_000.0),
            rope_scale(cfg, "full_attention"),
        )
        self.rotary_local = Rotary(
            head_dim, rope_theta(cfg, _SLIDING, "rope_local_base_freq", 10_000.0)
        )
        sliding = cfg.get("sliding_window")
        if sliding is None:
            self.window: int | None = None
        elif self.causal:
            # A causal window keeps distances < sliding_window, the token itself included.
            self.window = 2 * (int(sliding) - 1)
        else:
            # A bidirectional window as config.json spells it is the whole span, half each side
            # (transformers turns it into the exclusive bound sliding_window // 2 + 1).
            self.window = int(sliding)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        position_ids: torch.Tensor,
        seqs: PackedSequences,
    ) -> torch.Tensor:
        weight = self.embed_tokens.weight
        x = self.embed_tokens(input_ids) * torch.tensor(self.embed_scale, dtype=weight.dtype)
        ropes = {
            _SLIDING: self.rotary_local(position_ids, x.dtype),
            "full_attention": self.rotary_global(position_ids, x.dtype),
        }
        for layer, kind in zip(self.layers, self.types, strict=True):
            window = self.window if kind == _SLIDING else None
            rope = ropes[_SLIDING if kind == _SLIDING else "full_attention"]
            x = layer(x, rope, seqs, self.causal, window)
        return self.norm(x)
