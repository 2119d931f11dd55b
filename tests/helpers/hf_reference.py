"""The transformers reference, run the plainest way: one input at a time, no padding.

Token ids come from the folder's tokenizer.json, exactly the ids the server sees, so that the
comparison isolates the model (transformers' AutoTokenizer may pick another tokenizer class
for a model type than the one the folder ships, as it does for qwen2).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer


def _tokenizer(folder: Path, max_length: int) -> Tokenizer:
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length)
    return tok


def _each_alone(model: Any, tok: Tokenizer, texts: Sequence[str]) -> Iterator[Any]:
    """The model's output for each text on its own, unpadded."""
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([tok.encode(text).ids])
            yield model(input_ids=ids, attention_mask=torch.ones_like(ids))


def transformers_embed(
    folder: Path,
    texts: Sequence[str],
    pooling: str,
    *,
    max_length: int = 128,
    normalize: bool = True,
) -> np.ndarray:
    """AutoModel's last hidden state, pooled (cls, mean or last_token), optionally normalized."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(folder)).eval()
    out = []
    for result in _each_alone(model, _tokenizer(folder, max_length), texts):
        hidden = result.last_hidden_state[0]
        vec = {"cls": hidden[0], "mean": hidden.mean(0), "last_token": hidden[-1]}[pooling]
        if normalize:
            vec = torch.nn.functional.normalize(vec, dim=0)
        out.append(vec.numpy())
    return np.stack(out)


def transformers_logits(
    folder: Path, inputs: Sequence[str | tuple[str, str]], *, max_length: int = 128
) -> np.ndarray:
    """AutoModelForSequenceClassification's logits for texts and (query, passage) pairs."""
    from transformers import AutoModelForSequenceClassification

    tok = _tokenizer(folder, max_length)
    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    types = int(getattr(model.config, "type_vocab_size", 0) or 0) > 1
    out = []
    with torch.no_grad():
        for item in inputs:
            enc = tok.encode(item) if isinstance(item, str) else tok.encode(*item)
            kwargs = {"input_ids": torch.tensor([enc.ids])}
            kwargs["attention_mask"] = torch.ones_like(kwargs["input_ids"])
            if types:
                kwargs["token_type_ids"] = torch.tensor([enc.type_ids])
            out.append(model(**kwargs).logits[0].numpy())
    return np.stack(out)


def transformers_splade(folder: Path, texts: Sequence[str], *, max_length: int = 512) -> np.ndarray:
    """SPLADE from AutoModelForMaskedLM: the max over tokens of log(1 + ReLU(logits))."""
    from transformers import AutoModelForMaskedLM

    model = AutoModelForMaskedLM.from_pretrained(str(folder)).eval()
    tok = _tokenizer(folder, max_length)
    outputs = _each_alone(model, tok, texts)
    return np.stack([torch.log1p(torch.relu(r.logits[0])).amax(0).numpy() for r in outputs])
