"""transformers outputs for the tiny classifier and reranker checkpoints."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch


def hf_logits(folder: Path, inputs: Sequence[str | tuple[str, str]]) -> np.ndarray:
    """Sequence-classification logits of each text or (text, text) pair, one at a time."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    rows = []
    with torch.no_grad():
        for item in inputs:
            args = item if isinstance(item, tuple) else (item,)
            encoded = tokenizer(*args, return_tensors="pt")
            rows.append(model(**encoded).logits[0].numpy())
    return np.stack(rows)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
