"""Qwen3 (Qwen3-Embedding): the Qwen2 decoder without biases, with RMSNorm on each head of q and
k before the rotation and an explicit `head_dim` (not hidden / heads).

Qwen3-Embedding pools the last token and asks for an instruction prompt on queries
(`config_sentence_transformers.json` prompts, served through `prompt_name`).
"""

from __future__ import annotations

from vectorpress.backends.torch.models.qwen2 import DecoderModel


class Qwen3Model(DecoderModel):
    qk_norm = True
