"""One line per native architecture: how to build it and where its checkpoint keys go.

A model's checkpoint keys are renamed in two passes: the task wrapper prefix (`bert.`,
`roberta.`) is stripped, then the head rules move head keys under `head.` and everything else
goes under `encoder.`. Keys of heads the served task does not use are dropped by name; nothing
else is ever dropped.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from torch import nn

Rules = tuple[tuple[str, "str | None"], ...]


@dataclass(frozen=True)
class HeadRules:
    """Where a head's checkpoint keys go, and the head's shape."""

    rules: Rules
    activation: str = "tanh"
    dense: bool = True
    tied: tuple[tuple[str, str], ...] = ()
    """(head key, encoder key) pairs that may be absent because the weights are tied."""


@dataclass(frozen=True)
class Architecture:
    model_types: tuple[str, ...]
    encoder: str
    """`module:Class` of the encoder, imported only when used."""
    base_prefixes: tuple[str, ...]
    classifier: HeadRules | None = None
    mlm: HeadRules | None = None
    ignore: tuple[str, ...] = ()
    """Keys never used by any task (buffers saved by old versions)."""
    examples: tuple[str, ...] = field(default=())
    """Names of the tiny checkpoints in tests/ that exercise this line (checked by a test)."""

    def build_encoder(self, config: dict[str, object]) -> nn.Module:
        module_name, cls_name = self.encoder.split(":")
        module = importlib.import_module(f"vectorpress.backends.torch.models.{module_name}")
        return getattr(module, cls_name)(config)  # type: ignore[no-any-return]


_BERT = Architecture(
    model_types=("bert",),
    encoder="bert:BertModel",
    base_prefixes=("bert.",),
    classifier=HeadRules(
        rules=((r"^pooler\.dense\.", "head.dense."), (r"^classifier\.", "head.out_proj.")),
    ),
    mlm=HeadRules(
        rules=(
            (r"^cls\.predictions\.transform\.dense\.", "head.dense."),
            (r"^cls\.predictions\.transform\.LayerNorm\.", "head.layer_norm."),
            (r"^cls\.predictions\.decoder\.weight$", "head.decoder.weight"),
            (r"^cls\.predictions\.bias$", "head.bias"),
            (r"^cls\.predictions\.decoder\.bias$", None),
        ),
        tied=(("head.decoder.weight", "encoder.embeddings.word_embeddings.weight"),),
    ),
    ignore=(
        r"^embeddings\.position_ids$",
        r"^cls\.seq_relationship\.",
        r"^pooler\.",
        r"^cls\.",
        r"^classifier\.",
    ),
    examples=("bert",),
)

_ROBERTA = Architecture(
    model_types=("roberta", "xlm-roberta", "camembert"),
    encoder="bert:BertModel",
    base_prefixes=("roberta.", "camembert."),
    classifier=HeadRules(
        rules=(
            (r"^classifier\.dense\.", "head.dense."),
            (r"^classifier\.out_proj\.", "head.out_proj."),
        ),
    ),
    mlm=HeadRules(
        rules=(
            (r"^lm_head\.dense\.", "head.dense."),
            (r"^lm_head\.layer_norm\.", "head.layer_norm."),
            (r"^lm_head\.decoder\.weight$", "head.decoder.weight"),
            (r"^lm_head\.bias$", "head.bias"),
            (r"^lm_head\.decoder\.bias$", None),
        ),
        tied=(("head.decoder.weight", "encoder.embeddings.word_embeddings.weight"),),
    ),
    ignore=(r"^embeddings\.position_ids$", r"^pooler\.", r"^lm_head\.", r"^classifier\."),
    examples=("roberta", "xlm-roberta"),
)

REGISTRY: dict[str, Architecture] = {
    model_type: arch for arch in (_BERT, _ROBERTA) for model_type in arch.model_types
}


def lookup(model_type: str) -> Architecture | None:
    return REGISTRY.get(model_type)
