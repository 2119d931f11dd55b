"""Mistral (e5-mistral style embedders): the Llama-style decoder without biases, whose
`sliding_window`, when set, applies to every layer."""

from __future__ import annotations

from typing import Any

from vectorpress.backends.torch.models.qwen2 import DecoderModel, causal_window


class MistralModel(DecoderModel):
    def layer_windows(self, cfg: dict[str, Any]) -> list[int | None]:
        return [causal_window(cfg.get("sliding_window"))] * cfg["num_hidden_layers"]
