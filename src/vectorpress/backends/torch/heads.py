"""What comes after the encoder: Dense projections, classification heads, the MLM head.

Attribute names are the module's own; each architecture's remap table in the registry says
which checkpoint keys land here.
"""

from __future__ import annotations

import torch
from torch import nn

from vectorpress.backends.common.activations import Activation, activation
from vectorpress.backends.torch.layers import FusedLinear
from vectorpress.backends.torch.passes import bucket_rows


class ClassificationHead(nn.Module):
    """dense -> activation (-> LayerNorm) -> out_proj on the pooled token.

    BERT's pooler + classifier, RoBERTa's classifier.dense + out_proj and DistilBERT's
    pre_classifier + classifier all have this shape; they differ in the activation. ModernBERT
    adds a LayerNorm after the activation; decoders (Qwen's `score`) keep only a bias-free
    out_proj.
    """

    def __init__(
        self,
        hidden: int,
        num_labels: int,
        act: str = "tanh",
        dense: bool = True,
        *,
        dense_bias: bool = True,
        out_bias: bool = True,
        norm_eps: float | None = None,
        norm_bias: bool = True,
    ) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden, bias=dense_bias) if dense else None
        self.act: Activation = activation(act)
        self.norm = (
            nn.LayerNorm(hidden, eps=norm_eps, bias=norm_bias) if norm_eps is not None else None
        )
        self.out_proj = nn.Linear(hidden, num_labels, bias=out_bias)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        x = pooled
        if self.dense is not None:
            x = self.act(self.dense(x))
        if self.norm is not None:
            x = self.norm(x)
        return self.out_proj(x)


class MLMHead(nn.Module):
    """dense -> activation -> LayerNorm -> decoder to the vocabulary, plus a bias.

    ModernBERT's has the same shape with its biases switched by config (`classifier_bias`,
    `norm_bias`, `decoder_bias`). SPLADE pooling takes it in two parts, `transform` and
    `vocab_scores` (the decoder without its bias), see `pooling.splade_pool`.
    """

    def __init__(
        self,
        hidden: int,
        vocab: int,
        act: str,
        eps: float,
        *,
        dense_bias: bool = True,
        norm_bias: bool = True,
        decoder_bias: bool = True,
    ) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden, bias=dense_bias)
        self.act = activation(act)
        self.layer_norm = nn.LayerNorm(hidden, eps=eps, bias=norm_bias)
        self.decoder = nn.Linear(hidden, vocab, bias=False)
        self.bias = nn.Parameter(torch.zeros(vocab)) if decoder_bias else None
        self.vocab_size = vocab
        self._decoder: FusedLinear | None = None

    def fuse(self) -> None:
        """The vocabulary projection on FusedLinear (oneDNN on the weight reordered once, where
        this CPU has it). Called once the weights are final and on their device and dtype.

        It is most of a small SPLADE model's work (SPLADE-tiny: 7.8 of 8.6 MFLOP per token), and
        its shape, a short input against 30,522 outputs, is one where MKL's sgemm behind
        F.linear ran at half oneDNN's speed on a Zen 4 (16-512 rows of 128, 384 or 768 inputs:
        83-110 GFLOP/s against 137-219). The dense layer before it stays on F.linear: it runs
        on a whole batch's row count, and oneDNN would keep a primitive for every count met
        (see passes.bucket_rows), for a GEMM hidden / vocabulary of its size (1/40-1/240).
        """
        self._decoder = FusedLinear.of(self.decoder)

    def transform(self, hidden: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layer_norm(self.act(self.dense(hidden)))
        return out

    def vocab_scores(self, x: torch.Tensor) -> torch.Tensor:
        """The decoder's output for transformed states `x`, without the bias."""
        if self._decoder is None or not self._decoder.onednn:
            out: torch.Tensor = self.decoder(x)
            return out
        # oneDNN keeps a primitive per row count: a few counts only (see passes.bucket_rows).
        rows = x.shape[0]
        padded = bucket_rows(rows)
        if padded > rows:
            x = torch.cat([x, x.new_zeros(padded - rows, x.shape[1])])
        return self._decoder(x)[:rows]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = self.vocab_scores(self.transform(hidden))
        return x + self.bias if self.bias is not None else x
