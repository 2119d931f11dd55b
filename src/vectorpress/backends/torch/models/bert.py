"""BERT, and the RoBERTa family (RoBERTa, XLM-RoBERTa, CamemBERT) that shares its layout.

Post-LayerNorm encoder with learned absolute positions and token-type embeddings. What differs
for the RoBERTa family lives outside this file: position ids start after the padding index
(the tokenizer pool adds the offset) and type_vocab_size is 1.

Every linear layer runs on the flat `(total_tokens, hidden)` tensor of the batch's real tokens;
only attention sees sequence bounds. Attribute names follow the Hugging Face state dict.
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


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        hidden = cfg["hidden_size"]
        self.word_embeddings = nn.Embedding(cfg["vocab_size"], hidden)
        self.position_embeddings = nn.Embedding(cfg["max_position_embeddings"], hidden)
        self.token_type_embeddings = nn.Embedding(cfg.get("type_vocab_size", 2), hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=cfg.get("layer_norm_eps", 1e-12))

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        if self.token_type_embeddings.num_embeddings == 1:
            token_type_ids = torch.zeros_like(token_type_ids)
        x = (
            self.word_embeddings(input_ids)
            + self.token_type_embeddings(token_type_ids)
            + self.position_embeddings(position_ids)
        )
        return self.LayerNorm(x)


class BertSelfAttention(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)


class BertSelfOutput(nn.Module):
    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)


class BertAttention(nn.Module):
    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.self = BertSelfAttention(hidden)
        self.output = BertSelfOutput(hidden, eps)


class BertIntermediate(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, intermediate)


class BertOutput(nn.Module):
    def __init__(self, hidden: int, intermediate: int, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(intermediate, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)


class PostNormFFN(Fusable):
    """What BERT's layer shares with MPNet's: the feed-forward half and its fused GEMMs. Each
    subclass adds its own `attention` block."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        hidden, eps = cfg["hidden_size"], cfg.get("layer_norm_eps", 1e-12)
        self.heads = cfg["num_attention_heads"]
        self.intermediate = BertIntermediate(hidden, cfg["intermediate_size"])
        self.output = BertOutput(hidden, cfg["intermediate_size"], eps)
        self.act_name = cfg.get("hidden_act", "gelu")
        self.fused: FusedPostNormLayer | None = None


class BertLayer(PostNormFFN):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__(cfg)
        self.attention = BertAttention(cfg["hidden_size"], cfg.get("layer_norm_eps", 1e-12))

    def parts(self) -> PostNormParts:
        sa = self.attention.self
        return PostNormParts(
            self.heads,
            (sa.query, sa.key, sa.value),
            self.attention.output.dense,
            (self.intermediate.dense, self.output.dense),
            self.act_name,
            self.attention.output.LayerNorm,
            self.output.LayerNorm,
        )

    def fuse(self, fast: bool = True) -> None:
        """Prepare the layer's GEMMs once the weights are final: Q, K and V as one projection,
        the FFN activation fused into its GEMM, weights in the kernel's layout."""
        self.fused = FusedPostNormLayer.of(self.parts(), fast)

    def forward(self, x: torch.Tensor, seqs: PackedSequences) -> torch.Tensor:
        norm = self.attention.output.LayerNorm
        return built(self.fused)(x, seqs, norm, self.output.LayerNorm)


class BertEncoder(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg["num_hidden_layers"]))


class BertModel(FusedModel):
    """Returns the last hidden state of every real token, `(total_tokens, hidden)`."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertEncoder(cfg)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        position_ids: torch.Tensor,
        seqs: PackedSequences,
    ) -> torch.Tensor:
        x = self.embed(input_ids, token_type_ids, position_ids)
        for layer in self.encoder.layer:
            x = layer(x, seqs)
        return x

    # What the short-pass kernel runs (`short_kernel.py`'s PostNormEncoder).
    def embed(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        out: torch.Tensor = self.embeddings(input_ids, token_type_ids, position_ids)
        return out

    def embedding_sum(self) -> EmbeddingSum:
        emb = self.embeddings
        types = emb.token_type_embeddings
        return EmbeddingSum(
            (
                (emb.word_embeddings, 0),
                (types, 1 if types.num_embeddings > 1 else None),
                (emb.position_embeddings, 2),
            ),
            emb.LayerNorm,
        )

    def layer_parts(self) -> list[PostNormParts]:
        return [layer.parts() for layer in self.encoder.layer]  # type: ignore[operator]

    def score_bias(self, length: int) -> torch.Tensor | None:
        return None
