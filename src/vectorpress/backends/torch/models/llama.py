"""Llama (LLM2Vec-style embedders and Llama-based rerankers): the Llama-style decoder of
qwen2.py, with biases on every attention projection when `attention_bias` says so and on the
MLP when `mlp_bias` does. Llama 3's `llama3` rotary scaling has no native table; such configs
are served by the transformers fallback (see the registry's refusal)."""

from __future__ import annotations

from typing import Any

from vectorpress.backends.torch.models.qwen2 import Biases, DecoderModel


class LlamaModel(DecoderModel):
    def biases(self, cfg: dict[str, Any]) -> Biases:
        attention = bool(cfg.get("attention_bias", False))
        return Biases(qkv=attention, o=attention, mlp=bool(cfg.get("mlp_bias", False)))
