"""One line per native architecture: how to build it and where its checkpoint keys go.

A model's checkpoint keys are renamed in two passes: the task wrapper prefix (`bert.`,
`roberta.`) is stripped, then the head rules move head keys under `head.` and everything else
goes under `encoder.`. Keys of heads the served task does not use are dropped by name; nothing
else is ever dropped.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from vectorpress.backends.torch.blocks import FusedModel

Rules = tuple[tuple[str, "str | None"], ...]


@dataclass(frozen=True)
class HeadRules:
    """Where a head's checkpoint keys go, and the head's shape."""

    rules: Rules
    activation: str = "tanh"
    dense: bool = True
    tied: tuple[tuple[str, str], ...] = ()
    """(head key, encoder key) pairs that may be absent because the weights are tied."""
    out_bias: bool = True
    norm: bool = False
    """A LayerNorm after the activation (ModernBERT)."""
    from_config: tuple[tuple[str, str], ...] = ()
    """(head option, config key) pairs: options the checkpoint's config sets when present."""

    def head_options(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """Keyword arguments of ClassificationHead for this checkpoint."""
        opts: dict[str, Any] = {
            "act": self.activation,
            "dense": self.dense,
            "out_bias": self.out_bias,
        }
        if self.norm:
            opts["norm_eps"] = 1e-5
        return {**opts, **self.overrides(cfg)}

    def overrides(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """The head options this checkpoint's config sets."""
        return {option: cfg[key] for option, key in self.from_config if cfg.get(key) is not None}


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
    classifier_pooling: str = "cls"
    """The token a classification head reads when the config does not say (decoders: last)."""
    gpu_dtype: str = "float16"
    """The default dtype off the CPU."""
    rotary: bool = False
    """Rotary positions: configs with rotary scaling the native tables lack go to the fallback."""

    def refusal(self, config: dict[str, Any], splade: bool = False) -> str | None:
        """Why this checkpoint, though of a native type, needs the fallback; None if it does not."""
        if splade and self.mlm is None:
            return "its masked-LM head (for SPLADE) has no native implementation"
        if self.rotary:
            from vectorpress.backends.torch.rotary import unsupported_rotary

            return unsupported_rotary(config)
        return None

    def build_encoder(self, config: dict[str, object]) -> FusedModel:
        module_name, cls_name = self.encoder.split(":")
        module = importlib.import_module(f"vectorpress.backends.torch.models.{module_name}")
        encoder = getattr(module, cls_name)(config)
        assert isinstance(encoder, FusedModel), f"{self.encoder} is no FusedModel"
        return encoder


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
    examples=("roberta", "xlm-roberta", "camembert"),
)

_DISTILBERT = Architecture(
    model_types=("distilbert",),
    encoder="distilbert:DistilBertModel",
    base_prefixes=("distilbert.",),
    classifier=HeadRules(
        rules=((r"^pre_classifier\.", "head.dense."), (r"^classifier\.", "head.out_proj.")),
        activation="relu",
    ),
    mlm=HeadRules(
        rules=(
            (r"^vocab_transform\.", "head.dense."),
            (r"^vocab_layer_norm\.", "head.layer_norm."),
            (r"^vocab_projector\.weight$", "head.decoder.weight"),
            (r"^vocab_projector\.bias$", "head.bias"),
        ),
        tied=(("head.decoder.weight", "encoder.embeddings.word_embeddings.weight"),),
    ),
    ignore=(
        r"^embeddings\.position_ids$",
        r"^pre_classifier\.",
        r"^classifier\.",
        r"^vocab_(transform|layer_norm|projector)\.",
    ),
    examples=("distilbert",),
)

_MPNET = Architecture(
    model_types=("mpnet",),
    encoder="mpnet:MPNetModel",
    base_prefixes=("mpnet.",),
    classifier=HeadRules(
        rules=(
            (r"^classifier\.dense\.", "head.dense."),
            (r"^classifier\.out_proj\.", "head.out_proj."),
        ),
    ),
    mlm=_ROBERTA.mlm,
    ignore=(r"^embeddings\.position_ids$", r"^pooler\.", r"^lm_head\.", r"^classifier\."),
    examples=("mpnet",),
)

_MODERNBERT = Architecture(
    model_types=("modernbert",),
    encoder="modernbert:ModernBertModel",
    base_prefixes=("model.",),
    classifier=HeadRules(
        rules=(
            (r"^head\.dense\.", "head.dense."),
            (r"^head\.norm\.", "head.norm."),
            (r"^classifier\.", "head.out_proj."),
        ),
        activation="gelu",
        norm=True,
        from_config=(
            ("act", "classifier_activation"),
            ("dense_bias", "classifier_bias"),
            ("norm_bias", "norm_bias"),
            ("norm_eps", "norm_eps"),
        ),
    ),
    mlm=HeadRules(
        rules=(
            (r"^head\.dense\.", "head.dense."),
            (r"^head\.norm\.", "head.layer_norm."),
            (r"^decoder\.weight$", "head.decoder.weight"),
            (r"^decoder\.bias$", "head.bias"),
        ),
        tied=(("head.decoder.weight", "encoder.embeddings.tok_embeddings.weight"),),
        from_config=(
            ("act", "classifier_activation"),
            ("eps", "norm_eps"),
            ("dense_bias", "classifier_bias"),
            ("norm_bias", "norm_bias"),
            ("decoder_bias", "decoder_bias"),
        ),
    ),
    ignore=(r"^head\.", r"^decoder\.", r"^classifier\."),
    examples=("modernbert",),
    rotary=True,
)


def _decoder(model_type: str, encoder: str, gpu_dtype: str = "float16") -> Architecture:
    """Llama-style decoders: `model.` under task wrappers, a bias-free `score` classifier on the
    last token."""
    return Architecture(
        gpu_dtype=gpu_dtype,
        rotary=True,
        model_types=(model_type,),
        encoder=encoder,
        base_prefixes=("model.",),
        classifier=HeadRules(
            rules=((r"^score\.", "head.out_proj."),),
            activation="identity",
            dense=False,
            out_bias=False,
        ),
        ignore=(r"^lm_head\.", r"^score\.", r"\.rotary_emb\.inv_freq$"),
        examples=(model_type,),
        classifier_pooling="last_token",
    )


_QWEN2 = _decoder("qwen2", "qwen2:Qwen2Model")
_QWEN3 = _decoder("qwen3", "qwen3:Qwen3Model")
_MISTRAL = _decoder("mistral", "mistral:MistralModel")
_LLAMA = _decoder("llama", "llama:LlamaModel")
# Gemma3's activations outgrow float16's range (its own authors run it in bfloat16).
_GEMMA3_TEXT = _decoder("gemma3_text", "gemma3_text:Gemma3TextModel", gpu_dtype="bfloat16")

REGISTRY: dict[str, Architecture] = {
    model_type: arch
    for arch in (
        _BERT,
        _ROBERTA,
        _DISTILBERT,
        _MPNET,
        _MODERNBERT,
        _QWEN2,
        _QWEN3,
        _MISTRAL,
        _LLAMA,
        _GEMMA3_TEXT,
    )
    for model_type in arch.model_types
}


def lookup(model_type: str) -> Architecture | None:
    return REGISTRY.get(model_type)
