"""Rotary position embeddings and RMSNorm, shared by the rotary model files.

Rotary tables are computed per batch from the packed position ids, so sequences of any mix of
lengths share one `(total_tokens, head_dim)` cos/sin pair.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vectorpress.errors import StartupError


def rope_theta(
    cfg: dict[str, Any], layer_type: str | None, legacy_key: str, default: float
) -> float:
    """The rotary base of a layer type, from transformers 5's `rope_parameters` or the older keys.

    transformers 5 writes `rope_parameters` either flat (`{"rope_theta": ...}`) or per layer type
    (`{"full_attention": {...}, "sliding_attention": {...}}`); older checkpoints carry
    `rope_theta`, `global_rope_theta`, `local_rope_theta` or `rope_local_base_freq`.
    """
    params = _rope_params(cfg, layer_type)
    if params.get("rope_theta") is not None:
        return float(params["rope_theta"])
    return float(cfg.get(legacy_key) or default)


def _rope_params(cfg: dict[str, Any], layer_type: str | None) -> dict[str, Any]:
    params = cfg.get("rope_parameters") or {}
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        return dict(params[layer_type])
    if "rope_type" in params or "rope_theta" in params:
        return dict(params)
    return dict(cfg.get("rope_scaling") or {})


_SUPPORTED = ("default", "linear")


def unsupported_rotary(cfg: dict[str, Any]) -> str | None:
    """Why the native rotary tables cannot reproduce this config's, or None when they can."""
    params = cfg.get("rope_parameters") or {}
    candidates = [v for v in params.values() if isinstance(v, dict)] or [params]
    candidates.append(cfg.get("rope_scaling") or {})
    for p in candidates:
        kind = p.get("rope_type") or p.get("type") or "default"
        if kind not in _SUPPORTED:
            return f"rotary scaling {kind!r} has no native implementation"
    return None


def rope_scale(cfg: dict[str, Any], layer_type: str | None) -> float:
    """Linear position scaling (Gemma3's global layers); other rotary variants are refused."""
    params = _rope_params(cfg, layer_type)
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind == "default":
        return 1.0
    if kind == "linear":
        return float(params["factor"])
    raise StartupError(f"rotary scaling {kind!r} is not supported by the native backend")


class Rotary(nn.Module):
    """cos/sin tables for one rotary base, in the `rotate_half` layout transformers uses.

    The frequencies are computed in float32 as transformers computes them; `cos`/`sin` are cast
    to the activations' dtype, as there.
    """

    inv_freq: torch.Tensor

    def __init__(self, head_dim: int, base: float, scale: float = 1.0) -> None:
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        self.register_buffer("inv_freq", inv_freq / scale, persistent=False)

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(total_tokens,) positions -> cos, sin of shape (total_tokens, 1, head_dim)."""
        freqs = positions.float()[:, None] * self.inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply the rotation to `(total_tokens, heads, head_dim)` queries or keys."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, as Llama-style checkpoints expect.

    `offset` 1.0 is Gemma's `(1 + w)` form with the product taken in float32 before the cast;
    offset 0.0 is Llama/Qwen/Mistral's, which casts back before multiplying by `w`.
    """

    def __init__(self, dim: int, eps: float, offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))
        self.eps = eps
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:
            return (h * (self.offset + self.weight.float())).to(x.dtype)
        return self.weight * h.to(x.dtype)
