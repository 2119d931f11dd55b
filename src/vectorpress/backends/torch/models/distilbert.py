"""DistilBERT: BERT with six layers, no token types and no pooler.

Post-LayerNorm like BERT, learned absolute positions, eps fixed at 1e-12 (the config has no
field for it). Its config names differ from BERT's (`dim`, `n_heads`, `hidden_dim`,
`activation`), and its attribute names are its own (`q_lin`, `sa_layer_norm`, `ffn.lin1`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.torch.blocks import (
    EmbeddingSum,
    Fusable,
    FusedModel,
    FusedPostNormLayer,
    PostNormParts,
    built,
)

_EPS = 1e-12


class Embeddings(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        dim = cfg["dim"]
        self.word_embeddings = nn.Embedding(cfg["vocab_size"], dim)
        self.position_embeddings = nn.Embedding(cfg["max_position_embeddings"], dim)
        self.LayerNorm = nn.LayerNorm(dim, eps=_EPS)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        return self.LayerNorm(x)


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_lin = nn.Linear(dim, dim)
        self.k_lin = nn.Linear(dim, dim)
        self.v_lin = nn.Linear(dim, dim)
        self.out_lin = nn.Linear(dim, dim)


class FFN(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.lin1 = nn.Linear(dim, hidden)
        self.lin2 = nn.Linear(hidden, dim)


class TransformerBlock(Fusable):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        dim = cfg["dim"]
        self.act_name = cfg.get("activation", "gelu")
        self.attention = MultiHeadSelfAttention(dim, cfg["n_heads"])
        self.sa_layer_norm = nn.LayerNorm(dim, eps=_EPS)
        self.ffn = FFN(dim, cfg["hidden_dim"])
        self.output_layer_norm = nn.LayerNorm(dim, eps=_EPS)
        self.fused: FusedPostNormLayer | None = None

    def parts(self) -> PostNormParts:
        sa = self.attention
        return PostNormParts(
            sa.heads,
            (sa.q_lin, sa.k_lin, sa.v_lin),
            sa.out_lin,
            (self.ffn.lin1, self.ffn.lin2),
            self.act_name,
            self.sa_layer_norm,
            self.output_layer_norm,
        )

    def fuse(self, fast: bool = True) -> None:
        self.fused = FusedPostNormLayer.of(self.parts(), fast)

    def forward(self, x: torch.Tensor, seqs: PackedSequences) -> torch.Tensor:
        return built(self.fused)(x, seqs, self.sa_layer_norm, self.output_layer_norm)


class Transformer(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg["n_layers"]))


class DistilBertModel(FusedModel):
    """Returns the last hidden state of every real token, `(total_tokens, dim)`."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.embeddings = Embeddings(cfg)
        self.transformer = Transformer(cfg)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        position_ids: torch.Tensor,
        seqs: PackedSequences,
    ) -> torch.Tensor:
        x = self.embed(input_ids, token_type_ids, position_ids)
        for layer in self.transformer.layer:
            x = layer(x, seqs)
        return x

    # What the short-pass kernel runs (`short_kernel.py`'s PostNormEncoder).
    def embed(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        out: torch.Tensor = self.embeddings(input_ids, position_ids)
        return out

    def embedding_sum(self) -> EmbeddingSum:
        emb = self.embeddings
        return EmbeddingSum(((emb.word_embeddings, 0), (emb.position_embeddings, 2)), emb.LayerNorm)

    def layer_parts(self) -> list[PostNormParts]:
        return [layer.parts() for layer in self.transformer.layer]  # type: ignore[operator]

    def score_bias(self, length: int) -> torch.Tensor | None:
        return None
