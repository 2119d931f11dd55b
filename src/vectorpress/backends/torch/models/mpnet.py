"""MPNet (all-mpnet-base-v2): BERT's post-LayerNorm layout plus a relative position bias.

What is special:
- positions start after the padding index (2 for pad id 1), as RoBERTa's: the tokenizer pool
  adds the offset, the model only looks them up;
- no token-type embeddings;
- every layer adds the same learned bias to its attention scores, one value per head and
  relative-distance bucket (T5-style buckets: 32, half per direction, exact below 8, log-spaced
  up to distance 128). The bucket count is fixed at 32 in the reference whatever
  `relative_attention_num_buckets` says; only the embedding table's size follows the config.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.torch.blocks import (
    EmbeddingSum,
    FusedModel,
    FusedPostNormLayer,
    PostNormParts,
    built,
)
from vectorpress.backends.torch.models.bert import PostNormFFN

_BUCKETS = 32
_MAX_DISTANCE = 128


def relative_buckets(length: int, device: torch.device) -> torch.Tensor:
    """(L, L) bucket index of the distance from query i to key j, as transformers buckets it."""
    pos = torch.arange(length, dtype=torch.long, device=device)
    n = -(pos[None, :] - pos[:, None])
    half = _BUCKETS // 2
    ret = (n < 0).to(torch.long) * half
    n = n.abs()
    exact = half // 2
    large = exact + (
        torch.log(n.float() / exact) / math.log(_MAX_DISTANCE / exact) * (half - exact)
    ).to(torch.long)
    large = torch.clamp(large, max=half - 1)
    return ret + torch.where(n < exact, n, large)


class MPNetEmbeddings(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        hidden = cfg["hidden_size"]
        self.word_embeddings = nn.Embedding(cfg["vocab_size"], hidden)
        self.position_embeddings = nn.Embedding(cfg["max_position_embeddings"], hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=cfg.get("layer_norm_eps", 1e-12))

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        out: torch.Tensor = self.LayerNorm(x)
        return out


class MPNetSelfAttention(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.o = nn.Linear(hidden, hidden)


class MPNetAttention(nn.Module):
    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.attn = MPNetSelfAttention(hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)


class MPNetLayer(PostNormFFN):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__(cfg)
        self.attention = MPNetAttention(cfg["hidden_size"], cfg.get("layer_norm_eps", 1e-12))

    def parts(self) -> PostNormParts:
        sa = self.attention.attn
        return PostNormParts(
            self.heads,
            (sa.q, sa.k, sa.v),
            sa.o,
            (self.intermediate.dense, self.output.dense),
            self.act_name,
            self.attention.LayerNorm,
            self.output.LayerNorm,
        )

    def fuse(self, fast: bool = True) -> None:
        self.fused = FusedPostNormLayer.of(self.parts(), fast)

    def forward(self, x: torch.Tensor, seqs: PackedSequences, bias: Any) -> torch.Tensor:
        fused = built(self.fused)
        return fused(x, seqs, self.attention.LayerNorm, self.output.LayerNorm, bias)


class MPNetEncoder(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(MPNetLayer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.relative_attention_bias = nn.Embedding(
            cfg.get("relative_attention_num_buckets", _BUCKETS), cfg["num_attention_heads"]
        )


class MPNetModel(FusedModel):
    """Returns the last hidden state of every real token, `(total_tokens, hidden)`."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.embeddings = MPNetEmbeddings(cfg)
        self.encoder = MPNetEncoder(cfg)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        position_ids: torch.Tensor,
        seqs: PackedSequences,
    ) -> torch.Tensor:
        x = self.embed(input_ids, token_type_ids, position_ids)
        cache: dict[tuple[int, torch.dtype], torch.Tensor] = {}

        def bias(length: int, dtype: torch.dtype) -> torch.Tensor:
            # One (heads, L, L) bias per distinct length and dtype, shared by every layer of the
            # batch: a bfloat16 model's attention asks for float32 on the CPU (attention.py).
            # Contiguous: the compiled attention takes it so, and would copy it every layer.
            if (length, dtype) not in cache:
                cache[(length, dtype)] = self.score_bias(length).to(dtype).contiguous()
            return cache[(length, dtype)]

        for layer in self.encoder.layer:
            x = layer(x, seqs, bias)
        return x

    # What the short-pass kernel runs (`short_kernel.py`'s PostNormEncoder).
    def embed(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        out: torch.Tensor = self.embeddings(input_ids, position_ids)
        return out

    def float32_parts(self) -> list[nn.Module]:
        # The bias is added to float32 scores on the CPU (a bfloat16 model's too, attention.py).
        # Rounded to bfloat16 it had cost all-mpnet-base-v2 cosine 0.9973 to float32 on one
        # benchmark text (0.9999 kept), a rounding that compounds with the others.
        return [self.encoder.relative_attention_bias]

    def embedding_sum(self) -> EmbeddingSum:
        emb = self.embeddings
        return EmbeddingSum(((emb.word_embeddings, 0), (emb.position_embeddings, 2)), emb.LayerNorm)

    def layer_parts(self) -> list[PostNormParts]:
        return [layer.parts() for layer in self.encoder.layer]  # type: ignore[operator]

    def score_bias(self, length: int) -> torch.Tensor:
        """The `(heads, L, L)` relative position bias of a sequence of `length` tokens: it
        depends on j - i only, so a shorter sequence's is the top-left corner of a longer's."""
        table = self.encoder.relative_attention_bias
        return table(relative_buckets(length, table.weight.device)).permute(2, 0, 1)
